package index

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// A trivially correct model of the index: pointer nodes with maps (Dynamo's shape, with this package's tree
// rule for lookup hits attached elsewhere), a plain slice as the log, linear scans for classification.

var (
	seedFlag  = flag.Uint64("seed", 0, "TestModel: replay this seed (0 = time-based)")
	stepsFlag = flag.Int("steps", 3000, "TestModel: events per run")
)

type mNode struct {
	bh, th   uint64
	children map[uint64]*mNode
	workers  map[uint32]bool
	parent   *mNode
	root     bool
}

func newMNode(bh, th uint64) *mNode {
	return &mNode{bh: bh, th: th, children: map[uint64]*mNode{}, workers: map[uint32]bool{}}
}

type mTree struct {
	root   *mNode
	lookup map[uint32]map[uint64]*mNode
}

func newMTree() *mTree {
	r := newMNode(0, 0)
	r.root = true
	return &mTree{root: r, lookup: map[uint32]map[uint64]*mNode{}}
}

func (t *mTree) lk(dp uint32) map[uint64]*mNode {
	if t.lookup[dp] == nil {
		t.lookup[dp] = map[uint64]*mNode{}
	}
	return t.lookup[dp]
}

func (t *mTree) store(dp uint32, hasParent bool, parent uint64, blocks []Block) Status {
	lk := t.lk(dp)
	p := t.root
	if hasParent {
		p = lk[parent]
		if p == nil {
			return StatusParentNotFound
		}
	}
	for _, b := range blocks {
		c := p.children[b.TokensHash]
		if c == nil {
			x := lk[b.BlockHash]
			anc := false
			for n := p; n != nil; n = n.parent {
				if n == x {
					anc = true
				}
			}
			switch {
			case x != nil && anc:
				return StatusInvalidBlockSequence
			case x != nil && !t.attached(x):
				c = x
			default:
				c = newMNode(b.BlockHash, b.TokensHash)
			}
			p.children[b.TokensHash] = c
			c.parent, c.th = p, b.TokensHash
		}
		lk[b.BlockHash] = c
		c.workers[dp] = true
		p = c
	}
	return StatusOK
}

// attached reports whether x hangs under a live parent. A node is alive while it is the root, has a lookup
// entry, or hangs under a live parent (Dynamo's reference counting); a parent pointer to a dead node is stale.
func (t *mTree) attached(x *mNode) bool {
	return x.parent != nil && t.alive(x.parent)
}

func (t *mTree) alive(n *mNode) bool {
	if n.root {
		return true
	}
	for _, lk := range t.lookup {
		for _, v := range lk {
			if v == n {
				return true
			}
		}
	}
	return t.attached(n)
}

func (t *mTree) clearChildren(x *mNode) {
	for _, c := range x.children {
		c.parent = nil
	}
	x.children = map[uint64]*mNode{}
}

func (t *mTree) remove(dp uint32, hashes []uint64) Status {
	lk := t.lk(dp)
	st := StatusOK
	for _, h := range hashes {
		x := lk[h]
		if x == nil {
			st = StatusBlockNotFound
			continue
		}
		delete(x.workers, dp)
		if len(x.workers) == 0 {
			t.clearChildren(x)
		}
		delete(lk, h)
	}
	return st
}

func (t *mTree) clear() {
	for dp, lk := range t.lookup {
		for _, x := range lk {
			delete(x.workers, dp)
			if len(x.workers) == 0 {
				t.clearChildren(x)
			}
		}
		t.lookup[dp] = map[uint64]*mNode{}
	}
}

// dump returns the BFS dump as sorted "dp parent block tokens" lines (order between siblings is free).
func (t *mTree) dump() []string {
	var out []string
	q := []*mNode{t.root}
	for len(q) > 0 {
		n := q[0]
		q = q[1:]
		for _, c := range n.children {
			for dp := range c.workers {
				p := "null"
				if !n.root {
					p = fmt.Sprint(n.bh)
				}
				out = append(out, fmt.Sprintf("%d %s %d %d", dp, p, c.bh, c.th))
			}
			q = append(q, c)
		}
	}
	slices.Sort(out)
	return out
}

func (t *mTree) resident() int {
	n := 0
	for _, lk := range t.lookup {
		n += len(lk)
	}
	return n
}

func (t *mTree) findMatches(seq []uint64, earlyExit bool) map[uint32]uint32 {
	scores := map[uint32]uint32{}
	if len(seq) == 0 {
		return scores
	}
	cur := t.root.children[seq[0]]
	if cur == nil || len(cur.workers) == 0 {
		return scores
	}
	active := map[uint32]bool{}
	for w := range cur.workers {
		active[w] = true
	}
	depth := uint32(1)
	if !(earlyExit && len(active) == 1) {
		for idx := 1; idx < len(seq); idx++ {
			c := cur.children[seq[idx]]
			if c == nil {
				break
			}
			if len(c.workers) != len(active) {
				for w := range active {
					if !c.workers[w] {
						scores[w] = depth
						delete(active, w)
					}
				}
			}
			if len(active) == 0 {
				break
			}
			depth = uint32(idx + 1)
			cur = c
			if earlyExit && len(active) == 1 {
				break
			}
		}
	}
	for w := range active {
		scores[w] = depth
	}
	return scores
}

// mLog models the event log and the loss bookkeeping.
type mEvent struct {
	id        uint64
	dp        uint32
	kind      Kind
	hasParent bool
	parent    uint64
	blocks    []Block
	hashes    []uint64
}

type model struct {
	tree     *mTree
	max      int
	events   []mEvent // the current numbering, all of it (the log is its last max)
	seenAny  bool
	lastSeen uint64
	lostHi   []uint64 // upper ends of lost ranges in the current numbering
	tainted  bool
}

func (m *model) buffer() []mEvent {
	if len(m.events) > m.max {
		return m.events[len(m.events)-m.max:]
	}
	return m.events
}

func (m *model) lose(first, last uint64) {
	if m.seenAny && first > m.lastSeen+1 {
		first = m.lastSeen + 1
	}
	m.lostHi = append(m.lostHi, last)
	m.tainted = true
	if !m.seenAny || last > m.lastSeen {
		m.lastSeen = last
	}
	m.seenAny = true
}

func (m *model) unknown() {
	if m.seenAny {
		m.lostHi = append(m.lostHi, m.lastSeen)
	}
	m.tainted = true
}

func (m *model) apply(ev mEvent) Status {
	switch {
	case !m.seenAny:
		m.seenAny = true
	case ev.id == m.lastSeen+1:
	case ev.id > m.lastSeen:
		m.lostHi = append(m.lostHi, ev.id-1)
		m.tainted = true
	default:
		m.events = nil
		m.lostHi = nil
	}
	m.lastSeen = ev.id
	var st Status
	switch ev.kind {
	case KindStored:
		st = m.tree.store(ev.dp, ev.hasParent, ev.parent, ev.blocks)
	case KindRemoved:
		m.tree.lk(ev.dp)
		st = m.tree.remove(ev.dp, ev.hashes)
	case KindCleared:
		m.tree.lk(ev.dp)
		m.tree.clear()
		m.tainted = false
	}
	m.events = append(m.events, ev)
	return st
}

// expect returns the expected variant and, for Events, the ids; for TreeDump and TooNew the last id.
func (m *model) expect(start, end *uint64) (RespKind, []uint64, uint64) {
	buf := m.buffer()
	if start != nil && end != nil && *end < *start {
		return RespInvalidRange, nil, 0
	}
	dump := func() (RespKind, []uint64, uint64) {
		if m.tainted {
			return RespError, nil, 0
		}
		if len(buf) == 0 {
			return RespTreeDump, nil, 0
		}
		return RespTreeDump, nil, buf[len(buf)-1].id
	}
	if start == nil || len(buf) == 0 {
		return dump()
	}
	first, last := buf[0].id, buf[len(buf)-1].id
	crossing := false
	var maxLost uint64
	for _, hi := range m.lostHi {
		if hi >= *start {
			crossing = true
		}
		maxLost = max(maxLost, hi)
	}
	if *start > last {
		if crossing {
			return RespError, nil, 0
		}
		return RespTooNew, nil, last
	}
	if *start < first {
		return dump()
	}
	from := -1
	if crossing {
		for i := len(buf) - 1; i >= 0 && buf[i].id >= *start; i-- {
			if buf[i].kind == KindCleared && buf[i].id > maxLost {
				from = i
				break
			}
		}
		if from < 0 {
			return RespError, nil, 0
		}
	} else {
		for i := range buf {
			if buf[i].id >= *start {
				from = i
				break
			}
		}
	}
	var ids []uint64
	for _, e := range buf[from:] {
		ids = append(ids, e.id)
	}
	return RespEvents, ids, last
}

// TestModel drives the index and the model with the same random stream and compares them.
// Replay a failure with: go test ./index -run TestModel -seed N
func TestModel(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	runs := 4
	if *seedFlag != 0 {
		runs = 1
	}
	for r := range runs {
		s := seed + uint64(r)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Logf("seed %d (replay: go test ./index -run TestModel -seed %d)", s, s)
			runModel(t, s, *stepsFlag)
		})
	}
}

func runModel(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const bs = 2
	maxBuf := 1 + rng.IntN(40)
	ix, err := New(Config{WorkerID: 3, BlockSize: bs, MaxBufferSize: maxBuf})
	if err != nil {
		t.Fatal(err)
	}
	m := &model{tree: newMTree(), max: maxBuf}
	ctx := context.Background()
	var id uint64 = uint64(rng.IntN(3))
	dps := []uint32{0, 1, 2}
	if rng.IntN(4) == 0 { // exercise worker sets beyond 64 dp_ranks
		for d := uint32(3); d < 70; d++ {
			dps = append(dps, d)
		}
	}
	loras := [][]byte{nil, []byte("a"), []byte("lora-b")}
	var lastSeqs [][]uint64 // tokens-hash sequences stored recently, for matching
	for step := 0; step < steps; step++ {
		// Next id: mostly consecutive, sometimes a gap or a backwards/duplicate id.
		switch p := rng.IntN(100); {
		case p < 3:
			id += 2 + uint64(rng.IntN(3))
		case p < 5 && id > 0:
			id -= uint64(rng.IntN(int(min(id, 5)) + 1))
		default:
			id++
		}
		dp := dps[rng.IntN(len(dps))]
		if rng.IntN(3) > 0 {
			dp = dps[rng.IntN(min(3, len(dps)))]
		}
		ev := mEvent{id: id, dp: dp}
		var res ApplyResult
		var gotErr error
		switch p := rng.IntN(100); {
		case p < 2:
			first := id
			last := id + uint64(rng.IntN(3))
			ix.MarkLost(first, last, "test loss")
			m.lose(first, last)
			id = last
			continue
		case p < 3:
			ix.MarkUnknownHistory("test unknown")
			m.unknown()
			id--
			continue
		case p < 6:
			ev.kind = KindCleared
			res, gotErr = ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindCleared})
		case p < 30:
			ev.kind = KindRemoved
			lk := m.tree.lookup[dp]
			for range 1 + rng.IntN(4) {
				if len(lk) > 0 && rng.IntN(5) > 0 {
					keys := mapKeys(lk)
					ev.hashes = append(ev.hashes, keys[rng.IntN(len(keys))])
				} else {
					ev.hashes = append(ev.hashes, uint64(rng.IntN(64)))
				}
			}
			res, gotErr = ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindRemoved, Hashes: ev.hashes})
		default:
			ev.kind = KindStored
			lk := m.tree.lookup[dp]
			if len(lk) > 0 && rng.IntN(3) > 0 {
				keys := mapKeys(lk)
				ev.hasParent, ev.parent = true, keys[rng.IntN(len(keys))]
			} else if rng.IntN(10) == 0 {
				ev.hasParent, ev.parent = true, uint64(rng.IntN(64))
			}
			n := rng.IntN(5)
			if rng.IntN(2) == 0 {
				// Through tokens: small token alphabet so windows repeat; block hashes derived from the prefix.
				eagle := rng.IntN(5) == 0
				lora := loras[rng.IntN(len(loras))]
				toks := make([]uint32, n*bs)
				for i := range toks {
					toks[i] = uint32(rng.IntN(3))
				}
				if eagle && n > 0 {
					toks = append(toks, uint32(rng.IntN(3)))
				}
				var bhLE []byte
				prev := ev.parent
				for i := range n {
					w := toks[i*bs : i*bs+bs]
					if eagle {
						w = toks[i*bs : i*bs+bs+1]
					}
					th := xxh3.HashSeed(tokensToLE(nil, w), Seed(lora))
					bh := (prev*31 + th) % 97
					if rng.IntN(10) == 0 {
						bh = uint64(rng.IntN(64))
					}
					prev = bh
					ev.blocks = append(ev.blocks, Block{bh, th})
					bhLE = append(bhLE, leU64(bh)...)
				}
				res, gotErr = ix.ApplyStoredTokens(id, dp, ev.hasParent, ev.parent, bhLE, tokensToLE(nil, toks), lora, eagle)
			} else {
				prev := ev.parent
				for range n {
					th := uint64(rng.IntN(4))
					bh := (prev*31 + th + 1) % 97
					if rng.IntN(8) == 0 {
						bh = uint64(rng.IntN(64))
					}
					prev = bh
					ev.blocks = append(ev.blocks, Block{bh, th})
				}
				res, gotErr = ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindStored, HasParent: ev.hasParent,
					Parent: ev.parent, Blocks: ev.blocks})
			}
			var seq []uint64
			for _, b := range ev.blocks {
				seq = append(seq, b.TokensHash)
			}
			lastSeqs = append(lastSeqs, seq)
			if len(lastSeqs) > 8 {
				lastSeqs = lastSeqs[1:]
			}
		}
		want := m.apply(ev)
		if res.Status != want {
			t.Fatalf("step %d: event %+v: status %v, model %v (err %v)", step, ev, res.Status, want, gotErr)
		}
		if (gotErr != nil) != (want != StatusOK) {
			t.Fatalf("step %d: err %v with status %v", step, gotErr, want)
		}
		if step%7 == 0 || step == steps-1 {
			compareModel(t, step, ix, m, rng, ctx, lastSeqs)
		}
	}
}

func compareModel(t *testing.T, step int, ix *Indexer, m *model, rng *rand.Rand, ctx context.Context, seqs [][]uint64) {
	t.Helper()
	st := ix.Stats()
	if st.ResidentBlocks != m.tree.resident() {
		t.Fatalf("step %d: resident %d, model %d", step, st.ResidentBlocks, m.tree.resident())
	}
	if st.Tainted != m.tainted {
		t.Fatalf("step %d: tainted %v, model %v", step, st.Tainted, m.tainted)
	}
	if buf := m.buffer(); st.Buffered != len(buf) || (len(buf) > 0 && (st.FirstEventID != buf[0].id || st.LastEventID != buf[len(buf)-1].id)) {
		t.Fatalf("step %d: log %d [%d..%d], model %d events", step, st.Buffered, st.FirstEventID, st.LastEventID, len(buf))
	}
	// The tree, through a fresh dump (the snapshot path, not the cache).
	snap, msg := ix.buildDump()
	ix.dumpBuilds.Add(^uint64(0))
	if msg == "" {
		_, v, err := decodeResponse(snap.json)
		if err != nil {
			t.Fatalf("step %d: decode dump: %v", step, err)
		}
		var got []string
		for i, e := range v.(jsEventList).Events {
			if e.Event.EventID != uint64(i) {
				t.Fatalf("step %d: dump event %d has id %d", step, i, e.Event.EventID)
			}
			_, ev, err := decodeRouterEvent(mustMarshal(t, e))
			if err != nil || len(ev.Blocks) != 1 {
				t.Fatalf("step %d: dump event %d: %v", step, i, err)
			}
			p := "null"
			if ev.HasParent {
				p = fmt.Sprint(ev.Parent)
			}
			got = append(got, fmt.Sprintf("%d %s %d %d", ev.DpRank, p, ev.Blocks[0].BlockHash, ev.Blocks[0].TokensHash))
		}
		slices.Sort(got)
		want := m.tree.dump()
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: dump differs\n got %v\nwant %v", step, got, want)
		}
	} else if !m.tainted {
		t.Fatalf("step %d: dump refused (%s) but the model is not tainted", step, msg)
	}
	// Matching.
	for _, s := range seqs {
		for _, early := range []bool{false, true} {
			got := map[uint32]uint32{}
			for _, sc := range ix.FindMatches(s, early) {
				got[sc.DpRank] = sc.Blocks
			}
			want := m.tree.findMatches(s, early)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d: FindMatches(%v, %v) = %v, model %v", step, s, early, got, want)
			}
		}
	}
	// Recovery queries around the id range.
	lo := m.lastSeen
	for range 4 {
		var start, end *uint64
		if rng.IntN(5) > 0 {
			v := lo - min(lo, uint64(rng.IntN(50))) + uint64(rng.IntN(3))
			start = &v
		}
		if rng.IntN(3) == 0 {
			v := lo - min(lo, uint64(rng.IntN(50))) + uint64(rng.IntN(3))
			end = &v
		}
		r, err := ix.Recover(ctx, start, end)
		if err != nil {
			t.Fatal(err)
		}
		kind, ids, last := m.expect(start, end)
		q := fmt.Sprintf("query(%s,%s)", ptrStr(start), ptrStr(end))
		if r.Kind != kind {
			t.Fatalf("step %d: %s = %v %s, model %v", step, q, r.Kind, r.JSON, kind)
		}
		gk, v, err := decodeResponse(r.JSON)
		if err != nil || gk != kind {
			t.Fatalf("step %d: %s: decode %v (%v)", step, q, err, gk)
		}
		switch kind {
		case RespEvents:
			l := v.(jsEventList)
			var got []uint64
			for _, e := range l.Events {
				got = append(got, e.Event.EventID)
			}
			if !slices.Equal(got, ids) || l.LastEventID != last {
				t.Fatalf("step %d: %s: ids %v last %d, model %v last %d", step, q, got, l.LastEventID, ids, last)
			}
		case RespTreeDump:
			if l := v.(jsEventList); l.LastEventID != last {
				t.Fatalf("step %d: %s: dump last %d, model %d", step, q, l.LastEventID, last)
			}
		case RespTooNew:
			if x := v.(jsTooNew); x.NewestAvail != last {
				t.Fatalf("step %d: %s: newest %d, model %d", step, q, x.NewestAvail, last)
			}
		}
	}
}

func ptrStr(p *uint64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func mapKeys(m map[uint64]*mNode) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func leU64(v uint64) []byte {
	var b [8]byte
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
	return b[:]
}

// TestModelRegressions replays seeds that once found a divergence (TestModel, 20000 steps).
func TestModelRegressions(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	// A lookup hit whose old parent was freed counts as detached (the model first kept a stale parent pointer).
	runModel(t, 1795972859919856347, 17000)
}
