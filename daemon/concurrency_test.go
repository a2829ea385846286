package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/wiretest"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// The concurrency simulation (after bbolt's simulation_test.go): one producer publishes a random event
// stream at full speed through a real ring, the daemon's drain goroutine applies it, and 64 query clients ask
// EVENTS, DUMP, STATS, MATCH and HEALTH meanwhile. Every reply is recorded with the window of states the daemon
// may have answered from: lo = the last id whose Publish had returned before the request was sent (read-your-
// writes: the daemon must have applied it) and hi = the last id whose publishing had begun when the reply
// arrived (the daemon cannot have applied more). After ingest, a fresh model index replays the same events and,
// at each state L, checks every reply that claims L (its last_event_id, newest_available or stats last id):
// lo <= L <= hi, and the reply equals the model's answer at L (Events, TooNew, InvalidRange byte for byte;
// TreeDumps by content, see dumpmodel_test.go; STATS counters field by field). An Events reply is also checked
// without the index package: exactly the generated events start..L, in order. A MATCH reply carries no state, so
// it must equal the model's scores at some state of its window. A failure names the seed;
// `go test -run Concurrency ./daemon/ -args -daemon.seed=N` replays the same event stream and query choices (not
// the same interleaving).

var simSeed = flag.Uint64("daemon.seed", 0, "seed of TestConcurrencySimulation (0: time-based)")

// simEvents is a reproducible event stream (ids 1..n, so that last_event_id 0 can only mean "nothing applied")
// with each block's parent and token window, to build MATCH queries that follow a stored path from the root.
type simEvents struct {
	evs    []fbs.EventSpec     // evs[k].Seq == k+1
	parent map[uint64]uint64   // block hash -> parent block hash (0: under the root)
	window map[uint64][]uint32 // block hash -> its tokens
}

// randomEvents generates a reproducible stream of stores, removes and clears over 3 dp_ranks.
func randomEvents(seed uint64, n int, bs uint32) *simEvents {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var live [3][]uint64
	next := uint64(1 << 20)
	s := &simEvents{evs: make([]fbs.EventSpec, 0, n), parent: map[uint64]uint64{}, window: map[uint64][]uint32{}}
	for i := range uint64(n) {
		id := i + 1
		dp := uint32(rng.IntN(3))
		switch r := rng.IntN(100); {
		case r < 1:
			s.evs = append(s.evs, cleared(id))
			live = [3][]uint64{}
		case r < 30 && len(live[dp]) > 0:
			j := rng.IntN(len(live[dp]))
			h := live[dp][j]
			live[dp] = append(live[dp][:j], live[dp][j+1:]...)
			s.evs = append(s.evs, removed(id, dp, h))
		default:
			nb := 1 + rng.IntN(4)
			hashes := make([]uint64, nb)
			for k := range hashes {
				hashes[k] = next
				next++
			}
			var parent *uint64
			if len(live[dp]) > 0 && rng.IntN(2) == 0 {
				parent = u64p(live[dp][rng.IntN(len(live[dp]))])
			}
			// Unique tokens per block: with tokens_hash collisions Dynamo's tree aliases block hashes, and a dump
			// extended from the cache is then not equivalent to a fresh one (see dumpmodel_test.go).
			toks := tokens(uint32(hashes[0])*bs, nb, bs)
			s.evs = append(s.evs, stored(id, dp, parent, hashes, toks))
			up := uint64(0)
			if parent != nil {
				up = *parent
			}
			for k, h := range hashes {
				s.parent[h], s.window[h] = up, toks[k*int(bs):(k+1)*int(bs)]
				up = h
			}
			live[dp] = append(live[dp], hashes...)
		}
	}
	return s
}

// pathTokens returns the tokens of the path from the root to block h, as the generator built it.
func (s *simEvents) pathTokens(h uint64) []uint32 {
	var chain []uint64
	for ; h != 0 && len(chain) < 64; h = s.parent[h] {
		chain = append(chain, h)
	}
	var out []uint32
	for _, b := range slices.Backward(chain) {
		out = append(out, s.window[b]...)
	}
	return out
}

// applySpec applies one generated event to a model index, as the daemon's drain loop does.
func applySpec(ix *index.Indexer, ev fbs.EventSpec) {
	switch ev.Kind {
	case fbs.KindStored:
		_, _ = ix.ApplyStoredTokens(ev.Seq, ev.DpRank, ev.HasParent, ev.ParentHash, wiretest.LE64(ev.BlockHashes), wiretest.LE32(ev.TokenIDs), []byte(ev.LoraName), ev.IsEagle)
	case fbs.KindRemoved:
		_, _ = ix.Apply(&index.Event{ID: ev.Seq, DpRank: ev.DpRank, Kind: index.KindRemoved, Hashes: ev.BlockHashes})
	case fbs.KindCleared:
		_, _ = ix.Apply(&index.Event{ID: ev.Seq, DpRank: ev.DpRank, Kind: index.KindCleared})
	}
}

// publishBlocking waits for room instead of dropping (the simulation wants no loss), then feeds the oracle.
func (p *producer) publishBlocking(ev fbs.EventSpec) {
	payload := fbs.Build(p.b, &ev)
	for !p.w.Append(shm.TypeEvent, payload) {
		time.Sleep(50 * time.Microsecond)
	}
	p.w.Publish()
	p.applyOracle(ev)
}

// variant returns the name of a WorkerKvQueryResponse variant ("Events", "TreeDump", ...).
func variant(body []byte) string {
	if len(body) < 2 {
		return ""
	}
	name, _, _ := bytes.Cut(body[2:], []byte(`"`))
	return string(name)
}

// simObs is one reply received during the simulation, with the window of states it may describe.
type simObs struct {
	client, q  int
	kind       sock.Kind
	start, end *uint64
	tokens     []uint32
	lo, hi     uint64
	body       []byte            // EVENTS, DUMP
	stats      sock.StreamStats  // STATS
	scores     []sock.MatchScore // MATCH
}

func (o *simObs) String() string {
	s := fmt.Sprintf("client %d query %d (%s, window %d..%d", o.client, o.q, o.kind, o.lo, o.hi)
	if o.start != nil {
		s += fmt.Sprintf(", start %d", *o.start)
	}
	if o.end != nil {
		s += fmt.Sprintf(", end %d", *o.end)
	}
	return s + ")"
}

// claimedState returns the state a recovery reply says it describes; ok is false for InvalidRange (stateless).
// It reads only the variant and the trailing watermark (dumps are large and parsed later when compared).
func claimedState(body []byte) (state uint64, ok bool, err error) {
	var field string
	switch variant(body) {
	case "Events", "TreeDump":
		field = `"last_event_id":`
	case "TooNew":
		field = `"newest_available":`
	case "InvalidRange":
		return 0, false, nil
	default:
		return 0, false, fmt.Errorf("unexpected response variant: %.200s", body)
	}
	i := bytes.LastIndex(body, []byte(field))
	if i < 0 || !bytes.HasSuffix(body, []byte("}}")) {
		return 0, false, fmt.Errorf("no %s at the end of %.200s", field, body)
	}
	num := body[i+len(field) : len(body)-2]
	if j := bytes.IndexByte(num, ','); j >= 0 { // a TreeDump's "reset_scope" follows (Dynamo 1.6.1 wire)
		num = num[:j]
	}
	state, err = strconv.ParseUint(string(num), 10, 64)
	return state, true, err
}

// checkEventsAgainstSpec checks an Events reply independently of the index package: it must list exactly the
// generated events start..last, in order, with their kinds, dp_ranks and block hashes.
func checkEventsAgainstSpec(body []byte, start uint64, evs []fbs.EventSpec) error {
	var resp struct {
		Events *struct {
			Events []struct {
				Event struct {
					EventID uint64          `json:"event_id"`
					DpRank  uint32          `json:"dp_rank"`
					Data    json.RawMessage `json:"data"` // "cleared" is a bare string
				} `json:"event"`
			} `json:"events"`
			LastEventID uint64 `json:"last_event_id"`
		}
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Events == nil {
		return fmt.Errorf("not an Events reply (%v)", err)
	}
	last := resp.Events.LastEventID
	if start > last || uint64(len(resp.Events.Events)) != last-start+1 {
		return fmt.Errorf("%d events for the suffix %d..%d", len(resp.Events.Events), start, last)
	}
	for k, e := range resp.Events.Events {
		id := start + uint64(k)
		spec := evs[id-1]
		ev := e.Event
		var data struct {
			Stored *struct {
				ParentHash *uint64 `json:"parent_hash"`
				Blocks     []struct {
					BlockHash uint64 `json:"block_hash"`
				} `json:"blocks"`
			} `json:"stored"`
			Removed *struct {
				BlockHashes []uint64 `json:"block_hashes"`
			} `json:"removed"`
		}
		var hashes []uint64
		kind := fbs.KindCleared
		switch {
		case string(ev.Data) == `"cleared"`:
		case json.Unmarshal(ev.Data, &data) != nil:
			return fmt.Errorf("event %d: bad data %.100s", id, ev.Data)
		case data.Stored != nil:
			kind = fbs.KindStored
			for _, b := range data.Stored.Blocks {
				hashes = append(hashes, b.BlockHash)
			}
			if (data.Stored.ParentHash != nil) != spec.HasParent || (spec.HasParent && *data.Stored.ParentHash != spec.ParentHash) {
				return fmt.Errorf("event %d: parent differs from the generated one", id)
			}
		case data.Removed != nil:
			kind, hashes = fbs.KindRemoved, data.Removed.BlockHashes
		default:
			return fmt.Errorf("event %d: unknown data %.100s", id, ev.Data)
		}
		if ev.EventID != id || ev.DpRank != spec.DpRank || kind != spec.Kind || !slices.Equal(hashes, spec.BlockHashes) {
			return fmt.Errorf("event #%d of the reply (id %d, dp %d, kind %v, hashes %v) is not generated event %d (dp %d, kind %v, hashes %v)",
				k, ev.EventID, ev.DpRank, kind, hashes, id, spec.DpRank, spec.Kind, spec.BlockHashes)
		}
	}
	return nil
}

// TestConcurrencySimulation: 64 query clients (events, dumps, stats, match, health) run while a producer
// publishes at full speed; every reply is checked against a model index at the state it claims (see above), and
// the final state equals the oracle's. Run under -race.
func TestConcurrencySimulation(t *testing.T) {
	const clients = 64
	n := 20000
	if testing.Short() {
		n = 1500
	}
	seed := *simSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (events %d)", seed, n)
	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 11, 4, 1<<18)
	sim := randomEvents(seed, n, 4)
	evs := sim.evs

	// begun: the last id whose publishing started (an upper bound of what the daemon can have applied);
	// published: the last id whose Publish returned (a lower bound of what a later query must see).
	var begun, published atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	obsCh := make(chan []*simObs, clients)
	for i := range clients {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var obs []*simObs
			defer func() { obsCh <- obs }()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			c, err := sock.Dial(context.Background(), ts.SocketPath())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			w := uint64(11)
			var lastL uint64 // the last state this client saw
			for count := 0; ; count++ {
				select {
				case <-done:
					return
				default:
				}
				o := &simObs{client: i, q: count, lo: published.Load()}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				switch (i + count) % 5 {
				case 0:
					o.kind = sock.KindDump
					o.body, err = c.Dump(ctx, &w)
				case 1:
					o.kind = sock.KindEvents
					var s uint64
					switch r := rng.IntN(100); {
					case r < 30: // resume where this client left off (a dump once it fell behind the log)
						s = lastL
					case r < 70: // a short suffix of what is published
						s = o.lo - min(o.lo, uint64(rng.IntN(64)))
					case r < 85: // somewhere back, sometimes beyond the log (a dump)
						s = o.lo - min(o.lo, uint64(rng.IntN(1500)))
					default: // at or just past the newest id known published (Events or TooNew)
						s = o.lo + uint64(rng.IntN(4))
					}
					o.start = u64p(s)
					if r := rng.IntN(100); r < 10 && s > 0 {
						o.end = u64p(s - 1) // InvalidRange
					} else if r < 25 {
						o.end = u64p(s + uint64(rng.IntN(8)))
					}
					o.body, err = c.Events(ctx, &w, o.start, o.end)
				case 2:
					o.kind = sock.KindStats
					var r sock.StatsReply
					r, err = c.Stats(ctx, &w)
					if err == nil && len(r.Streams) != 1 {
						err = fmt.Errorf("stats: %d streams", len(r.Streams))
					}
					if err == nil {
						o.stats = r.Streams[0]
					}
				case 3:
					o.kind = sock.KindMatch
					// The path of a block stored around the ids being published (queries are answered some hundreds
					// of events later under load, and the tree is cleared every ~100 events), sometimes with a
					// foreign tail.
					o.tokens = tokens(uint32(count), 2, 4)
					if k := min(int(begun.Load())+rng.IntN(512), n); k >= 1 && evs[k-1].Kind == fbs.KindStored {
						ev := evs[k-1]
						o.tokens = sim.pathTokens(ev.BlockHashes[rng.IntN(len(ev.BlockHashes))])
						if rng.IntN(2) == 0 { // a prefix: more likely still attached from the root
							o.tokens = o.tokens[:min(len(o.tokens), 4*(1+rng.IntN(3)))]
						}
						if rng.IntN(4) == 0 {
							o.tokens = append(o.tokens, tokens(7, 1, 4)...)
						}
					}
					var r sock.MatchReply
					r, err = c.Match(ctx, sock.MatchRequest{WorkerID: &w, Tokens: o.tokens})
					o.scores = r.Scores
				case 4:
					o.kind = sock.KindHealth
					var r sock.HealthReply
					r, err = c.Health(ctx)
					if err == nil && (r.Status != "ok" || r.Streams != 1) {
						err = fmt.Errorf("health: %+v", r)
					}
				}
				cancel()
				o.hi = begun.Load()
				if err != nil {
					errs <- fmt.Errorf("%v: %w", o, err)
					return
				}
				if o.body != nil {
					if l, ok, err := claimedState(o.body); err == nil && ok {
						lastL = max(lastL, l)
					}
				}
				if o.kind != sock.KindHealth {
					obs = append(obs, o)
				}
			}
		}(i)
	}
	t0 := time.Now()
	for _, ev := range evs {
		begun.Store(ev.Seq)
		p.publishBlocking(ev)
		published.Store(ev.Seq)
	}
	// Let the clients run a little against the final state too, then stop them.
	time.Sleep(50 * time.Millisecond)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(obsCh)
	var all []*simObs
	for obs := range obsCh {
		all = append(all, obs...)
	}
	t1 := time.Now()
	checkSimulation(t, seed, sim, p.oracle.Config(), all)
	t.Logf("ingest and queries %v, model check %v", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))

	c := dialT(t, ts.SocketPath())
	for _, start := range []*uint64{nil, u64p(uint64(n) - 100), u64p(uint64(n))} {
		got, err := c.Events(ctxT(t), u64p(11), start, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := p.oracle.Recover(context.Background(), start, nil)
		if !sameRecovery(t, got, want.JSON) {
			t.Fatalf("final state differs from the oracle (seed %d), start %v:\n got %.300s\nwant %.300s", seed, start, got, want.JSON)
		}
	}
}

// checkSimulation replays the events into a fresh model index and checks every observation at its state.
func checkSimulation(t *testing.T, seed uint64, sim *simEvents, cfg index.Config, all []*simObs) {
	t.Helper()
	n := uint64(len(sim.evs))
	failures := 0
	fail := func(o *simObs, format string, args ...any) {
		t.Helper()
		failures++
		if failures <= 10 {
			t.Errorf("seed %d: %v: %s", seed, o, fmt.Sprintf(format, args...))
		}
	}
	byState := map[uint64][]*simObs{}
	var matches []*simObs
	counts := map[string]int{}
	for _, o := range all {
		if o.lo > o.hi || o.hi > n {
			fail(o, "bad window (a test bug)")
			continue
		}
		switch o.kind {
		case sock.KindEvents, sock.KindDump:
			l, ok, err := claimedState(o.body)
			switch {
			case err != nil:
				fail(o, "%v", err)
				continue
			case !ok:
				l = o.lo // InvalidRange does not depend on the state
			case l < o.lo || l > o.hi:
				fail(o, "reply describes state %d outside the window: %.200s", l, o.body)
				continue
			}
			byState[l] = append(byState[l], o)
			counts[variant(o.body)]++
		case sock.KindStats:
			var l uint64
			if o.stats.LastEventID != nil {
				l = *o.stats.LastEventID
			}
			if l < o.lo || l > o.hi {
				fail(o, "stats describe state %d outside the window", l)
				continue
			}
			byState[l] = append(byState[l], o)
			counts["Stats"]++
		case sock.KindMatch:
			matches = append(matches, o)
			counts["Match"]++
			if len(o.scores) > 0 {
				counts["Match(hit)"]++
			}
		}
	}
	sort.Slice(matches, func(a, b int) bool { return matches[a].lo < matches[b].lo })

	model, err := index.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// same is sameRecovery with the replay of each distinct dump body done once (waiters of one dump build, and
	// cache hits, share a body).
	edgeCache := map[string]map[edge]bool{}
	edgesOf := func(body []byte) map[edge]bool {
		e, ok := edgeCache[string(body)]
		if !ok {
			e, _ = dumpEdges(t, body)
			edgeCache[string(body)] = e
		}
		return e
	}
	same := func(got, want []byte) bool {
		if bytes.Equal(got, want) {
			return true
		}
		if variant(got) != "TreeDump" || variant(want) != "TreeDump" {
			return false
		}
		gl, _, _ := claimedState(got)
		wl, _, _ := claimedState(want)
		ge, we := edgesOf(got), edgesOf(want)
		return gl == wl && maps.Equal(ge, we)
	}
	var active []*simObs
	for l := uint64(0); l <= n; l++ {
		if l > 0 {
			applySpec(model, sim.evs[l-1])
		}
		for _, o := range byState[l] {
			switch o.kind {
			case sock.KindEvents, sock.KindDump:
				var start *uint64
				if o.kind == sock.KindEvents {
					start = o.start
				}
				want, err := model.Recover(context.Background(), start, o.end)
				if err != nil {
					t.Fatal(err)
				}
				if !same(o.body, want.JSON) {
					fail(o, "reply differs from the model at state %d:\n got %.300s\nwant %.300s", l, o.body, want.JSON)
				} else if want.Kind == index.RespEvents {
					if err := checkEventsAgainstSpec(o.body, *start, sim.evs); err != nil {
						fail(o, "%v", err)
					}
				}
			case sock.KindStats:
				ms, s := model.Stats(), o.stats
				var first uint64
				if s.FirstEventID != nil {
					first = *s.FirstEventID
				}
				if first != ms.FirstEventID || s.Buffered != ms.Buffered || s.ResidentBlocks != ms.ResidentBlocks ||
					s.Tainted || s.LostEvents != 0 || s.IDResets != 0 || s.CorruptRecords != 0 || s.MalformedEvents != 0 ||
					s.EventsReceived < o.lo || s.EventsReceived > o.hi || !s.Attached || !s.ProducerAlive || s.StreamEpoch != 1 {
					fail(o, "stats at state %d: first %d buffered %d resident %d received %d tainted %v lost %d resets %d corrupt %d malformed %d attached %v alive %v epoch %d; the model has first %d buffered %d resident %d",
						l, first, s.Buffered, s.ResidentBlocks, s.EventsReceived, s.Tainted, s.LostEvents, s.IDResets, s.CorruptRecords,
						s.MalformedEvents, s.Attached, s.ProducerAlive, s.StreamEpoch, ms.FirstEventID, ms.Buffered, ms.ResidentBlocks)
				}
			}
		}
		// A MATCH reply must equal the model's scores at some state of its window.
		for len(matches) > 0 && matches[0].lo == l {
			active, matches = append(active, matches[0]), matches[1:]
		}
		keep := active[:0]
		for _, o := range active {
			scores, err := model.MatchTokens(o.tokens, "", false)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]index.Score, len(o.scores))
			for k, s := range o.scores {
				got[k] = index.Score{WorkerID: s.WorkerID, DpRank: s.DpRank, Blocks: s.Blocks}
			}
			switch {
			case slices.Equal(got, scores):
			case o.hi == l:
				fail(o, "match scores %v equal the model's at no state of the window (at %d: %v)", got, l, scores)
			default:
				keep = append(keep, o)
			}
		}
		active = keep
	}
	t.Logf("%d replies checked against the model: %v", len(all), counts)
}
