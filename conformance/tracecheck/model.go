package tracecheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvshm/kvshm/index"
)

// ErrAnswer is returned when an answer is not a WorkerKvQueryResponse the model can read.
var ErrAnswer = errors.New("kvshm/tracecheck: bad answer")

// Block is one stored block of a RouterEvent.
type Block struct {
	BlockHash  uint64 `json:"block_hash"`
	TokensHash uint64 `json:"tokens_hash"`
}

// RouterEvent is what the model reads of a RouterEvent.
type RouterEvent struct {
	DpRank uint32
	Kind   index.Kind
	Parent *uint64
	Blocks []Block
	Hashes []uint64
}

// Answer is a parsed WorkerKvQueryResponse.
type Answer struct {
	Variant     string // Events, TreeDump, TooNew, InvalidRange, Error (or another 1.6.1 variant name)
	Events      []RouterEvent
	LastEventID uint64
}

type wireEvent struct {
	Event struct {
		DpRank uint32          `json:"dp_rank"`
		Data   json.RawMessage `json:"data"`
	} `json:"event"`
}

type wireData struct {
	Stored *struct {
		ParentHash *uint64 `json:"parent_hash"`
		Blocks     []Block `json:"blocks"`
	} `json:"stored"`
	Removed *struct {
		BlockHashes []uint64 `json:"block_hashes"`
	} `json:"removed"`
}

// ParseAnswer reads a WorkerKvQueryResponse; errors wrap ErrAnswer.
func ParseAnswer(b []byte) (Answer, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil || len(top) != 1 {
		return Answer{}, fmt.Errorf("%w: not a one-variant object: %.80s", ErrAnswer, b)
	}
	var a Answer
	var body json.RawMessage
	for k, v := range top {
		a.Variant, body = k, v
	}
	if a.Variant != "Events" && a.Variant != "TreeDump" {
		return a, nil
	}
	var list struct {
		Events      []wireEvent `json:"events"`
		LastEventID *uint64     `json:"last_event_id"`
	}
	if err := json.Unmarshal(body, &list); err != nil || list.LastEventID == nil {
		return Answer{}, fmt.Errorf("%w: %s without events or last_event_id: %v", ErrAnswer, a.Variant, err)
	}
	a.LastEventID = *list.LastEventID
	for i, we := range list.Events {
		ev := RouterEvent{DpRank: we.Event.DpRank}
		if bytes.Equal(bytes.TrimSpace(we.Event.Data), []byte(`"cleared"`)) {
			ev.Kind = index.KindCleared
		} else {
			var d wireData
			if err := json.Unmarshal(we.Event.Data, &d); err != nil {
				return Answer{}, fmt.Errorf("%w: event %d: %v", ErrAnswer, i, err)
			}
			switch {
			case d.Stored != nil:
				ev.Kind, ev.Parent, ev.Blocks = index.KindStored, d.Stored.ParentHash, d.Stored.Blocks
			case d.Removed != nil:
				ev.Kind, ev.Hashes = index.KindRemoved, d.Removed.BlockHashes
			default:
				return Answer{}, fmt.Errorf("%w: event %d: unknown data %.60s", ErrAnswer, i, we.Event.Data)
			}
		}
		a.Events = append(a.Events, ev)
	}
	return a, nil
}

// Model is the consumer model of the package doc: per dp_rank, block hash -> path of tokens hashes, and a
// watermark per rank. Owned by one goroutine.
type Model struct {
	ranks map[uint32]map[uint64][]uint64
	marks map[uint32]uint64
}

// NewModel returns an empty consumer.
func NewModel() *Model {
	return &Model{ranks: map[uint32]map[uint64][]uint64{}, marks: map[uint32]uint64{}}
}

// Apply applies one event under rank dp (its own rank for a live event; the consumer's for a recovered one).
func (m *Model) Apply(dp uint32, ev RouterEvent) {
	switch ev.Kind {
	case index.KindCleared:
		delete(m.ranks, dp)
	case index.KindRemoved:
		for _, h := range ev.Hashes {
			delete(m.ranks[dp], h)
		}
	case index.KindStored:
		rs := m.ranks[dp]
		if rs == nil {
			rs = map[uint64][]uint64{}
			m.ranks[dp] = rs
		}
		var path []uint64
		if ev.Parent != nil {
			p, ok := rs[*ev.Parent]
			if !ok {
				return // ParentBlockNotFound: the whole store is skipped
			}
			path = p
		}
		for _, b := range ev.Blocks {
			path = append(slices.Clip(path), b.TokensHash)
			rs[b.BlockHash] = path
		}
	}
}

// Recover applies a recovery answer for rank dp as deepinfra's consumer does (only that rank's share of the
// events: see SplitRank).
func (m *Model) Recover(dp uint32, a Answer) {
	switch a.Variant {
	case "Events":
	case "TreeDump":
		delete(m.ranks, dp)
	default:
		return // TooNew, InvalidRange, Error: nothing at all
	}
	for _, ev := range a.Events {
		m.Apply(dp, ev)
	}
	m.marks[dp] = a.LastEventID
}

// SplitRank is the share of an answer's events for one rank (a Cleared only for its own rank, as in 1.6.1).
func SplitRank(a Answer, dp uint32) Answer {
	out := a
	out.Events = nil
	for _, ev := range a.Events {
		if ev.DpRank == dp {
			out.Events = append(out.Events, ev)
		}
	}
	return out
}

// State is the canonical text of the model: ranks in order, each with its sorted (path, hash) entries and its
// watermark. Equal states answer every later match and resolve every later event alike.
func (m *Model) State() string {
	var sb strings.Builder
	ranks := make([]uint32, 0, len(m.ranks)+len(m.marks))
	for r := range m.ranks {
		ranks = append(ranks, r)
	}
	for r := range m.marks {
		if _, ok := m.ranks[r]; !ok {
			ranks = append(ranks, r)
		}
	}
	slices.Sort(ranks)
	for _, r := range ranks {
		type entry struct {
			path []uint64
			hash uint64
		}
		var es []entry
		for h, p := range m.ranks[r] {
			es = append(es, entry{p, h})
		}
		slices.SortFunc(es, func(a, b entry) int {
			if c := slices.Compare(a.path, b.path); c != 0 {
				return c
			}
			return cmpU64(a.hash, b.hash)
		})
		mark, ok := m.marks[r]
		fmt.Fprintf(&sb, "rank %d watermark %d(%v):", r, mark, ok)
		for _, e := range es {
			fmt.Fprintf(&sb, " %v=%d", e.path, e.hash)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Watermarks is the canonical text of the per-rank watermarks alone.
func (m *Model) Watermarks() string {
	ranks := make([]uint32, 0, len(m.marks))
	for r := range m.marks {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	var sb strings.Builder
	for _, r := range ranks {
		fmt.Fprintf(&sb, "%d:%d ", r, m.marks[r])
	}
	return sb.String()
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// LiveEvent converts a trace's event op into the RouterEvent the engine's publish means in Dynamo 1.6.1: the
// tokens hashed over complete windows (Eagle: block_size+1 tokens), zipped with the block hashes (the shorter
// decides how many blocks are stored).
func LiveEvent(op Op, blockSize uint32) (RouterEvent, error) {
	ev := RouterEvent{DpRank: op.DpRank}
	switch op.Kind {
	case "cleared":
		ev.Kind = index.KindCleared
	case "removed":
		ev.Kind, ev.Hashes = index.KindRemoved, op.Hashes
	case "stored":
		lora := ""
		if op.LoraName != nil {
			lora = *op.LoraName
		}
		th, err := index.HashTokens(op.Tokens, blockSize, lora, op.IsEagle != nil && *op.IsEagle)
		if err != nil {
			return ev, fmt.Errorf("hash tokens of line %d: %w", op.Line, err)
		}
		ev.Kind, ev.Parent = index.KindStored, op.Parent
		for i := 0; i < len(op.Hashes) && i < len(th); i++ {
			ev.Blocks = append(ev.Blocks, Block{BlockHash: op.Hashes[i], TokensHash: th[i]})
		}
	default:
		return ev, fmt.Errorf("%w: line %d: %q is not an event", ErrTrace, op.Line, op.Kind)
	}
	return ev, nil
}
