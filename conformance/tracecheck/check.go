package tracecheck

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kvshm/kvshm/index"
)

// Outcome classifies one query: Identical, SameState, a deviation id ("D1"...), or Fail.
type Outcome string

// Outcomes other than deviation ids.
const (
	Identical Outcome = "identical"
	SameState Outcome = "same-state"
	Fail      Outcome = "FAIL"
)

// Result is the judgement of one query.
type Result struct {
	Line    int
	Start   *uint64
	End     *uint64
	Outcome Outcome
	Detail  string // why it failed, with both answers (Fail only)
	Ours    []byte
}

// Check replays t through a fresh index.Indexer and judges every query (see the package doc). Events kvshm
// refuses are reported as Fail results (Dynamo 1.6.1 takes every event a trace holds).
func Check(ctx context.Context, t *Trace) ([]Result, error) {
	h := t.Header
	ix, err := index.New(index.Config{WorkerID: h.WorkerID, BlockSize: h.BlockSize, MaxBufferSize: h.MaxBufferSize})
	if err != nil {
		return nil, fmt.Errorf("new index for trace %s: %w", h.Name, err)
	}
	var (
		results []Result
		fed     []Op // the events so far, for priming
		ranks   []uint32
	)
	for i, op := range t.Ops {
		if op.Kind != "query" {
			if !slices.Contains(ranks, op.DpRank) {
				ranks = append(ranks, op.DpRank)
			}
			if err := apply(ix, op); err != nil {
				results = append(results, Result{Line: op.Line, Outcome: Fail, Detail: "kvshm refused the event: " + err.Error()})
			}
			fed = append(fed, op)
			continue
		}
		resp, err := ix.Recover(ctx, op.Start, op.End)
		if err != nil {
			return results, fmt.Errorf("recover at line %d: %w", op.Line, err)
		}
		r := Result{Line: op.Line, Start: op.Start, End: op.End, Ours: resp.JSON}
		r.Outcome, r.Detail = judge(h, i, ranks, fed, op, resp.JSON)
		results = append(results, r)
	}
	return results, nil
}

// apply feeds one event op to the index as the daemon does (tokens hashed by the index). Tree statuses
// (ParentNotFound, BlockNotFound, InvalidBlockSequence) are Dynamo's too and not errors here.
func apply(ix *index.Indexer, op Op) error {
	var err error
	switch op.Kind {
	case "stored":
		hashes := make([]byte, 0, 8*len(op.Hashes))
		for _, v := range op.Hashes {
			hashes = binary.LittleEndian.AppendUint64(hashes, v)
		}
		tokens := make([]byte, 0, 4*len(op.Tokens))
		for _, v := range op.Tokens {
			tokens = binary.LittleEndian.AppendUint32(tokens, v)
		}
		var lora []byte
		if op.LoraName != nil {
			lora = []byte(*op.LoraName)
		}
		_, err = ix.ApplyStoredTokens(op.Seq, op.DpRank, op.Parent != nil, deref(op.Parent), hashes, tokens, lora,
			op.IsEagle != nil && *op.IsEagle)
	case "removed":
		_, err = ix.Apply(&index.Event{ID: op.Seq, DpRank: op.DpRank, Kind: index.KindRemoved, Hashes: op.Hashes})
	case "cleared":
		_, err = ix.Apply(&index.Event{ID: op.Seq, DpRank: op.DpRank, Kind: index.KindCleared})
	}
	if err == nil || errors.Is(err, index.ErrParentNotFound) || errors.Is(err, index.ErrBlockNotFound) ||
		errors.Is(err, index.ErrInvalidBlockSequence) {
		return nil
	}
	return err
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// judge classifies kvshm's answer against Dynamo's recorded one (the package doc's four outcomes).
func judge(h Header, opIndex int, ranks []uint32, fed []Op, q Op, ours []byte) (Outcome, string) {
	theirs := q.Answer
	if bytes.Equal(ours, theirs) {
		return Identical, ""
	}
	ma, errA := rebuild(h, ranks, fed, q.Start, ours)
	mb, errB := rebuild(h, ranks, fed, q.Start, theirs)
	if errB != nil {
		return Fail, fmt.Sprintf("Dynamo's recorded answer: %v", errB)
	}
	var a, b string
	if errA == nil {
		a = ma.State()
	}
	b = mb.State()
	if errA == nil && a == b {
		return SameState, ""
	}
	// A deviation is about content: both answers must still leave the consumer at the same watermarks.
	if dev := deviationAt(h, opIndex); dev != "" && errA == nil && ma.Watermarks() == mb.Watermarks() {
		return Outcome(dev), ""
	}
	why := "rebuilt states differ"
	if errA != nil {
		why = errA.Error()
	}
	return Fail, fmt.Sprintf("%s\n  kvshm:  %.300s\n  dynamo: %.300s\n  kvshm state:  %.400s\n  dynamo state: %.400s",
		why, ours, theirs, a, b)
}

// deviationAt is the lowest deviation id marked at or before op index i, or "".
func deviationAt(h Header, i int) string {
	var ids []string
	for id, at := range h.Deviations {
		if at <= i {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// rebuild primes a fresh Model with the live events before start (all of them when start is nil) and feeds it each
// rank's share of the answer. The variant is not part of the model's state: a TreeDump that rebuilds what the
// Events would have is as good for the consumer.
func rebuild(h Header, ranks []uint32, fed []Op, start *uint64, answer []byte) (*Model, error) {
	a, err := ParseAnswer(answer)
	if err != nil {
		return nil, err
	}
	m := NewModel()
	for _, op := range fed {
		if start != nil && op.Seq >= *start {
			continue
		}
		ev, err := LiveEvent(op, h.BlockSize)
		if err != nil {
			return nil, err
		}
		m.Apply(op.DpRank, ev)
	}
	for _, r := range ranks {
		m.Recover(r, SplitRank(a, r))
	}
	return m, nil
}
