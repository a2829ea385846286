package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
)

// publishBlocking waits for room instead of dropping (the simulation wants no loss), then feeds the oracle.
func (p *producer) publishBlocking(ev fbs.EventSpec) {
	payload := fbs.Build(p.b, &ev)
	for !p.w.Append(shm.TypeEvent, payload) {
		time.Sleep(50 * time.Microsecond)
	}
	p.w.Publish()
	p.applyOracle(ev)
}

// randomEvents generates a reproducible stream of stores, removes and clears over 3 dp_ranks.
func randomEvents(seed uint64, n int, bs uint32) []fbs.EventSpec {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var live [3][]uint64
	next := uint64(1 << 20)
	evs := make([]fbs.EventSpec, 0, n)
	for i := range uint64(n) {
		dp := uint32(rng.IntN(3))
		switch r := rng.IntN(100); {
		case r < 1:
			evs = append(evs, cleared(i))
			live = [3][]uint64{}
		case r < 30 && len(live[dp]) > 0:
			j := rng.IntN(len(live[dp]))
			h := live[dp][j]
			live[dp] = append(live[dp][:j], live[dp][j+1:]...)
			evs = append(evs, removed(i, dp, h))
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
			evs = append(evs, stored(i, dp, parent, hashes, tokens(uint32(hashes[0])*bs, nb, bs)))
			live[dp] = append(live[dp], hashes...)
		}
	}
	return evs
}

// TestConcurrentQueriesWhileIngesting: 64 query clients (events, dumps, stats, match, health) run while a producer
// publishes at full speed; every reply is well-formed and per-client monotonic, and the final state equals the
// oracle's. Run under -race.
func TestConcurrentQueriesWhileIngesting(t *testing.T) {
	const clients = 64
	n := 20000
	if testing.Short() {
		n = 1500
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (events %d)", seed, n)
	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 11, 4, 1<<18)
	evs := randomEvents(seed, n, 4)

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	var queries sync.Map
	for i := range clients {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := Dial(context.Background(), ts.SocketPath())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			w := uint64(11)
			var lastID uint64
			count := 0
			for {
				select {
				case <-done:
					queries.Store(i, count)
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				var body []byte
				switch (i + count) % 5 {
				case 0:
					body, err = c.Dump(ctx, &w)
				case 1:
					body, err = c.Events(ctx, &w, u64p(lastID), nil)
				case 2:
					var r StatsReply
					r, err = c.Stats(ctx, &w)
					if err == nil && len(r.Streams) != 1 {
						err = fmt.Errorf("stats: %d streams", len(r.Streams))
					}
				case 3:
					_, err = c.Match(ctx, MatchRequest{WorkerID: &w, Tokens: tokens(uint32(count), 2, 4)})
				case 4:
					_, err = c.Health(ctx)
				}
				cancel()
				if err != nil {
					errs <- fmt.Errorf("client %d query %d: %w", i, count, err)
					return
				}
				if body != nil {
					var resp map[string]json.RawMessage
					if err := json.Unmarshal(body, &resp); err != nil || len(resp) != 1 {
						errs <- fmt.Errorf("client %d: malformed response %.200s: %v", i, body, err)
						return
					}
					for k, v := range resp {
						if k == "Events" || k == "TreeDump" {
							var payload struct {
								LastEventID uint64 `json:"last_event_id"`
							}
							if err := json.Unmarshal(v, &payload); err != nil {
								errs <- err
								return
							}
							if payload.LastEventID < lastID {
								errs <- fmt.Errorf("client %d: last_event_id went back from %d to %d", i, lastID, payload.LastEventID)
								return
							}
							lastID = payload.LastEventID
						}
					}
				}
				count++
			}
		}(i)
	}
	for _, ev := range evs {
		p.publishBlocking(ev)
	}
	// Let the clients run a little against the final state too, then stop them.
	time.Sleep(50 * time.Millisecond)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	queries.Range(func(_, v any) bool { total += v.(int); return true })
	t.Logf("%d queries during ingest", total)

	c, err := Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, start := range []*uint64{nil, u64p(uint64(n) - 100), u64p(uint64(n) - 1)} {
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
