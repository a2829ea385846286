package index

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// TestConcurrentReaders runs one writer and several readers (Recover, FindMatches, Stats) at once. Every answer
// is checked against the model state at the id it reports: Events against the stream, fresh TreeDumps against
// the model's dump at their last_event_id. Run it under -race.
func TestConcurrentReaders(t *testing.T) {
	const events = 600
	rng := rand.New(rand.NewPCG(1, 2))
	ix, _ := New(Config{WorkerID: 5, BlockSize: 2, MaxBufferSize: 64})
	m := &model{tree: newMTree(), max: 64}
	stream := make([]mEvent, 0, events)
	dumps := map[uint64][]string{0: nil}
	for id := uint64(1); id <= events; id++ {
		ev := mEvent{id: id, dp: uint32(rng.IntN(3))}
		switch p := rng.IntN(100); {
		case p < 3:
			ev.kind = KindCleared
		case p < 30:
			ev.kind = KindRemoved
			for range 1 + rng.IntN(3) {
				ev.hashes = append(ev.hashes, uint64(rng.IntN(40)))
			}
		default:
			ev.kind = KindStored
			if lk := m.tree.lookup[ev.dp]; len(lk) > 0 && rng.IntN(2) == 0 {
				keys := mapKeys(lk)
				ev.hasParent, ev.parent = true, keys[rng.IntN(len(keys))]
			}
			prev := ev.parent
			for range 1 + rng.IntN(4) {
				th := uint64(rng.IntN(3))
				bh := (prev*7 + th + 1) % 40
				prev = bh
				ev.blocks = append(ev.blocks, Block{bh, th})
			}
		}
		m.apply(ev)
		stream = append(stream, ev)
		dumps[id] = m.tree.dump(false, 0)
	}

	var done atomic.Bool
	var reads, checked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	fail := func(format string, a ...any) {
		select {
		case errs <- fmt.Errorf(format, a...):
		default:
		}
	}
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := rand.New(rand.NewPCG(uint64(r), 9))
			ctx := context.Background()
			for !done.Load() {
				var start *uint64
				if rr.IntN(3) > 0 {
					st := ix.Stats()
					v := st.LastEventID - min(st.LastEventID, uint64(rr.IntN(80)))
					start = &v
				}
				resp, err := ix.Recover(ctx, start, nil)
				if err != nil {
					fail("recover: %v", err)
					return
				}
				kind, v, err := decodeResponse(resp.JSON)
				if err != nil || kind != resp.Kind {
					fail("decode %s: %v", resp.JSON, err)
					return
				}
				switch kind {
				case RespEvents:
					l := v.(jsEventList)
					for i, e := range l.Events {
						want := stream[e.Event.EventID-1]
						_, got, err := decodeRouterEvent(mustMarshalNoT(e))
						if err != nil || describeEvent(got) != describeEvent(toEvent(want)) {
							fail("event %d: %v %s, want %s", e.Event.EventID, err, describeEvent(got), describeEvent(toEvent(want)))
							return
						}
						if i > 0 && e.Event.EventID != l.Events[i-1].Event.EventID+1 {
							fail("events not consecutive")
							return
						}
					}
					if len(l.Events) == 0 || l.Events[len(l.Events)-1].Event.EventID != l.LastEventID {
						fail("events do not end at last_event_id %d", l.LastEventID)
						return
					}
					checked.Add(1)
				case RespTreeDump:
					if resp.CacheHit {
						continue
					}
					l := v.(jsEventList)
					got, err := flattenEvents(l)
					if err != nil {
						fail("dump: %v", err)
						return
					}
					if want := dumps[l.LastEventID]; !slices.Equal(got, want) {
						fail("dump at %d: %v, model %v", l.LastEventID, got, want)
						return
					}
					checked.Add(1)
				case RespTooNew:
				default:
					fail("unexpected %s", resp.JSON)
					return
				}
				ix.FindMatches([]uint64{0, 1, 2}, rr.IntN(2) == 0)
				reads.Add(1)
			}
		}()
	}
	for _, ev := range stream {
		if _, err := ix.Apply(ptr(toEvent(ev))); err != nil && !isSentinel(err) {
			t.Fatal(err)
		}
		if ev.id%25 == 0 {
			// Let every reader complete a few answers against this state before going on.
			target := reads.Load() + 8
			for reads.Load() < target && len(errs) == 0 {
				runtime.Gosched()
			}
		}
	}
	if n := checked.Load(); n == 0 {
		t.Errorf("readers checked no Events or fresh TreeDump answer")
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func ptr[T any](v T) *T { return &v }

func toEvent(e mEvent) Event {
	return Event{ID: e.id, DpRank: e.dp, Kind: e.kind, HasParent: e.hasParent, Parent: e.parent, Blocks: e.blocks, Hashes: e.hashes}
}

func mustMarshalNoT(e jsRouterEvent) []byte {
	b, err := jsonMarshal(e)
	if err != nil {
		panic(err)
	}
	return b
}
