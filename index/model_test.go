package index

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A trivially correct model of the index: pointer nodes with maps (Dynamo's shape, with this package's tree
// rule for lookup hits attached elsewhere), a plain slice as the log, linear scans for classification.

var (
	seedFlag  = flag.Uint64("seed", 0, "TestModel: replay this seed (0 = time-based)")
	stepsFlag = flag.Int("steps", 3000, "TestModel: events per run")
	everyFlag = flag.Bool("every", false, "TestModel: compare after every event")
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
		// A child no worker holds counts as absent (1.6.1 has pruned it); when a node is needed, it is reused in
		// place with the new block hash.
		c := p.children[b.TokensHash]
		var stale *mNode
		if c != nil && len(c.workers) == 0 {
			stale, c = c, nil
		}
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
				if stale != nil {
					stale.parent = nil
				}
			case stale != nil:
				t.clearChildren(stale)
				c = stale
				c.bh = b.BlockHash
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
		if x.bh != h && lk[x.bh] == x { // a second hash of a block the rank holds under its own: only it goes
			delete(lk, h)
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

// dump returns the BFS dump as sorted "dp parent block tokens" lines (order between siblings is free). With
// rank set, only that dp_rank's blocks, not descending below a node the rank does not hold.
func (t *mTree) dump(rank bool, r uint32) []string {
	var out []string
	q := []*mNode{t.root}
	for len(q) > 0 {
		n := q[0]
		q = q[1:]
		for _, c := range n.children {
			if rank && !c.workers[r] {
				continue
			}
			for dp := range c.workers {
				if rank && dp != r {
					continue
				}
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
	events   []mEvent // the log: at most max events, evicted a batch (equal ids) at a time
	cut      bool     // the front batch lost events (a batch longer than max): its id is answered with a dump
	seenAny  bool
	lastSeen uint64
	lostHi   []uint64 // upper ends of lost ranges in the current numbering
	tainted  bool
	strict   bool // LossError
	// The open batch (BeginBatch): events with its id after the first continue it.
	batchOn, batchSeen bool
	batchID            uint64
}

func (m *model) buffer() []mEvent {
	return m.events
}

// lose records the ids up to last as lost (the model needs only the upper end: a suffix crossing it is affected).
func (m *model) lose(last uint64) {
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
	cont := false
	if m.batchOn {
		if ev.id != m.batchID {
			m.batchOn = false
		} else {
			cont = m.batchSeen && m.seenAny && ev.id == m.lastSeen
			m.batchSeen = true
		}
	}
	switch {
	case cont:
		// The 2nd..kth event of a batch: same id, logged again.
	case !m.seenAny:
		m.seenAny = true
	case ev.id == m.lastSeen+1:
	case ev.id > m.lastSeen:
		// A gap: ids the producer never handed over; not a loss.
	default:
		m.events, m.cut = nil, false
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
	if m.max > 0 {
		m.events = append(m.events, ev)
		if len(m.events) > m.max {
			front := m.events[0].id
			if front == ev.id { // a batch longer than the log: only its oldest event goes
				m.events, m.cut = m.events[1:], true
			} else {
				for len(m.events) > 0 && m.events[0].id == front {
					m.events = m.events[1:]
				}
				m.cut = false
			}
		}
	}
	return st
}

// expect returns the expected variant, for Events the ids (of rank r's view when rank is set), for TreeDump
// and TooNew the last id, and whether the answer is incomplete.
func (m *model) expect(start, end *uint64, rank bool, r uint32) (RespKind, []uint64, uint64, bool) {
	buf := m.buffer()
	if start != nil && end != nil && *end < *start {
		return RespInvalidRange, nil, 0, false
	}
	dump := func() (RespKind, []uint64, uint64, bool) {
		if m.tainted && m.strict {
			return RespError, nil, 0, false
		}
		if len(buf) == 0 {
			return RespTreeDump, nil, 0, m.tainted
		}
		return RespTreeDump, nil, buf[len(buf)-1].id, m.tainted
	}
	if start == nil || len(buf) == 0 {
		return dump()
	}
	first, last := buf[0].id, buf[len(buf)-1].id
	lostFrom := func(from uint64) bool {
		for _, hi := range m.lostHi {
			if hi >= from {
				return true
			}
		}
		return false
	}
	if *start > last {
		if lostFrom(*start) {
			if m.strict {
				return RespError, nil, 0, false
			}
			return RespTooNew, nil, last, true
		}
		return RespTooNew, nil, last, false
	}
	if *start < first || (*start == first && m.cut) {
		return dump()
	}
	from := 0
	for from < len(buf) && buf[from].id < *start {
		from++
	}
	threshold := *start
	for i := len(buf) - 1; i >= from; i-- {
		if buf[i].kind == KindCleared {
			threshold = max(threshold, buf[i].id)
			break
		}
	}
	incomplete := lostFrom(threshold)
	if incomplete && m.strict {
		return RespError, nil, 0, false
	}
	var ids []uint64
	for _, e := range buf[from:] {
		if !rank || e.dp == r || e.kind == KindCleared {
			ids = append(ids, e.id)
		}
	}
	return RespEvents, ids, last, incomplete
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
	cfg := Config{WorkerID: 3, BlockSize: bs, MaxBufferSize: maxBuf}
	if rng.IntN(3) == 0 {
		cfg.OnLoss = LossError
	}
	if rng.IntN(3) == 0 {
		cfg.DumpShape = DumpBlocks
	}
	t.Logf("config %+v", cfg)
	ix, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &model{tree: newMTree(), max: maxBuf, strict: cfg.OnLoss == LossError}
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
	batchLeft := 0          // events left in the current batch (same id)
	for step := 0; step < steps; step++ {
		// Next id: mostly consecutive, sometimes a gap or a backwards/duplicate id; inside a batch, the same id.
		if batchLeft > 0 {
			batchLeft--
		} else {
			switch p := rng.IntN(100); {
			case p < 3:
				id += 2 + uint64(rng.IntN(3))
			case p < 5 && id > 0:
				id -= uint64(rng.IntN(int(min(id, 5)) + 1))
			default:
				id++
			}
			if rng.IntN(5) == 0 { // a batch of 2..5 events under this id (BeginBatch)
				batchLeft = 1 + rng.IntN(4)
				ix.BeginBatch(id)
				m.batchOn, m.batchSeen, m.batchID = true, false, id
			}
		}
		inBatch := m.batchOn && m.batchID == id
		dp := dps[rng.IntN(len(dps))]
		if rng.IntN(3) > 0 {
			dp = dps[rng.IntN(min(3, len(dps)))]
		}
		ev := mEvent{id: id, dp: dp}
		var res ApplyResult
		var gotErr error
		p := rng.IntN(100)
		if inBatch && p < 3 {
			p = 50 // a loss does not split a batch (the ring carries a batch as one record)
		}
		switch {
		case p < 2:
			first := id
			last := id + uint64(rng.IntN(3))
			ix.MarkLost(first, last, "test loss")
			m.lose(last)
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
				// Sometimes the token count does not match the blocks: the complete windows are zipped with the
				// block hashes (the token-and-hash-count decision).
				eagle := rng.IntN(5) == 0
				lora := loras[rng.IntN(len(loras))]
				ntok := n * bs
				if eagle && n > 0 {
					ntok++
				}
				mismatch := rng.IntN(8) == 0
				if mismatch {
					ntok = max(0, ntok+rng.IntN(2*bs+3)-bs-1)
				}
				toks := make([]uint32, ntok)
				for i := range toks {
					toks[i] = uint32(rng.IntN(3))
				}
				hs, err := HashTokens(toks, bs, string(lora), eagle)
				if err != nil {
					t.Fatal(err)
				}
				var bhLE []byte
				prev := ev.parent
				for i := range n {
					th := uint64(i)
					if i < len(hs) {
						th = hs[i]
					}
					bh := (prev*31 + th) % 97
					if rng.IntN(10) == 0 {
						bh = uint64(rng.IntN(64))
					}
					prev = bh
					if i < len(hs) {
						ev.blocks = append(ev.blocks, Block{bh, th})
					}
					bhLE = append(bhLE, leU64(bh)...)
				}
				wantMismatch := TokenCountMismatch(n, ntok, bs, eagle)
				res, gotErr = ix.ApplyStoredTokens(id, dp, ev.hasParent, ev.parent, bhLE, tokensToLE(nil, toks), lora, eagle)
				if res.TokenMismatch != wantMismatch {
					t.Fatalf("step %d: %d blocks, %d tokens, eagle %v: TokenMismatch %v", step, n, ntok, eagle, res.TokenMismatch)
				}
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
		checkTree(t, ix, fmt.Sprintf("step %d", step))
		if step%7 == 0 || step == steps-1 || *everyFlag {
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
	snap, msg := ix.buildDump(rankFilter{})
	ix.dumpBuilds.Add(^uint64(0))
	if msg == "" {
		_, v, err := decodeResponse(snap.encode())
		if err != nil {
			t.Fatalf("step %d: decode dump: %v", step, err)
		}
		got := flattenDump(t, step, v.(jsEventList))
		want := m.tree.dump(false, 0)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: dump differs\n got %v\nwant %v", step, got, want)
		}
	} else if !m.tainted || !m.strict {
		t.Fatalf("step %d: dump refused (%s) but the model is not tainted under LossError", step, msg)
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
		rank, r := rng.IntN(3) == 0, uint32(rng.IntN(3))
		var resp Response
		var err error
		if rank {
			resp, err = ix.RecoverRank(ctx, start, end, r)
		} else {
			resp, err = ix.Recover(ctx, start, end)
		}
		if err != nil {
			t.Fatal(err)
		}
		kind, ids, last, incomplete := m.expect(start, end, rank, r)
		q := fmt.Sprintf("query(%s,%s)", ptrStr(start), ptrStr(end))
		if rank {
			q += fmt.Sprintf(" rank %d", r)
		}
		if resp.Kind != kind {
			t.Fatalf("step %d: %s = %v %s, model %v", step, q, resp.Kind, resp.JSON, kind)
		}
		if resp.Incomplete != incomplete || resp.Incomplete != (len(resp.Lost) > 0) {
			t.Fatalf("step %d: %s: incomplete %v (lost %v), model %v", step, q, resp.Incomplete, resp.Lost, incomplete)
		}
		gk, v, err := decodeResponse(resp.JSON)
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
			l := v.(jsEventList)
			if l.LastEventID != last {
				t.Fatalf("step %d: %s: dump last %d, model %d", step, q, l.LastEventID, last)
			}
			if !resp.CacheHit { // a cached dump may carry a tail of real events
				if got, want := flattenDump(t, step, l), m.tree.dump(rank, r); !slices.Equal(got, want) {
					t.Fatalf("step %d: %s: dump differs\n got %v\nwant %v", step, q, got, want)
				}
			}
		case RespTooNew:
			if x := v.(jsTooNew); x.NewestAvail != last {
				t.Fatalf("step %d: %s: newest %d, model %d", step, q, x.NewestAvail, last)
			}
		}
	}
}

// flattenDump checks a TreeDump's synthetic ids and turns its events (single blocks or chains) into sorted
// "dp parent block tokens" lines, one per block.
func flattenDump(t *testing.T, step int, l jsEventList) []string {
	t.Helper()
	got, err := flattenEvents(l)
	if err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	return got
}

func flattenEvents(l jsEventList) ([]string, error) {
	var got []string
	for i, e := range l.Events {
		if e.Event.EventID != uint64(i) {
			return nil, fmt.Errorf("dump event %d has id %d", i, e.Event.EventID)
		}
		b, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		_, ev, err := decodeRouterEvent(b)
		if err != nil || ev.Kind != KindStored || len(ev.Blocks) == 0 {
			return nil, fmt.Errorf("dump event %d: %v (%s)", i, err, b)
		}
		p := "null"
		if ev.HasParent {
			p = fmt.Sprint(ev.Parent)
		}
		for _, b := range ev.Blocks {
			got = append(got, fmt.Sprintf("%d %s %d %d", ev.DpRank, p, b.BlockHash, b.TokensHash))
			p = fmt.Sprint(b.BlockHash)
		}
	}
	slices.Sort(got)
	return got, nil
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
