package zmqpub

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// replayPairs is replay as "seq:payload" strings.
func replayPairs(t *testing.T, ep string, start uint64) []string {
	t.Helper()
	var out []string
	for _, b := range replay(t, ep, seqBytes(start)) {
		out = append(out, fmt.Sprintf("%d:%s", binary.BigEndian.Uint64(b[0]), b[1]))
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSnapshotReply: a request the buffer cannot answer completely gets the snapshot's batches under its seq L,
// then the buffered batches after L, then the end marker; the snapshot is reused while the buffer covers the
// batches after L and rebuilt once it does not; a consumer past L gets the buffer only; a failed build leaves
// the reply the buffer's (counted incomplete).
func TestSnapshotReply(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 2})
	var builds atomic.Int32
	var seq atomic.Uint64
	var fail atomic.Bool
	p.SetSnapshotter(func() (Snapshot, error) {
		builds.Add(1)
		if fail.Load() {
			return Snapshot{}, errors.New("no tokens")
		}
		s := seq.Load()
		return Snapshot{Seq: s, Batches: [][]byte{[]byte(fmt.Sprintf("A%d", s)), []byte(fmt.Sprintf("B%d", s))}}, nil
	}, nil)
	publish := func(from, to uint64) {
		for s := from; s <= to; s++ {
			if s == 10 {
				p.PublishReset(s, []byte("r10"))
			} else {
				p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
			}
		}
		n := to - 9
		waitFor(t, func() bool { return p.Stats().Published == n }, "published")
	}
	check := func(start uint64, want []string, wantBuilds int32) {
		t.Helper()
		if got := replayPairs(t, rep, start); !equalStrings(got, want) {
			t.Fatalf("replay from %d: %q, want %q", start, got, want)
		}
		if got := builds.Load(); got != wantBuilds {
			t.Fatalf("replay from %d: %d builds, want %d", start, got, wantBuilds)
		}
	}
	publish(10, 15) // the buffer holds 14, 15
	seq.Store(13)   // the index was at 13 when the snapshot was taken (14, 15 still queued to the publisher)
	check(11, []string{"13:A13", "13:B13", "14:b14", "15:b15"}, 1)
	check(12, []string{"13:A13", "13:B13", "14:b14", "15:b15"}, 1) // shared: the buffer still covers after 13
	check(14, []string{"14:b14", "15:b15"}, 1)                     // the buffer answers: no snapshot
	publish(16, 17)                                                // 14, 15 evicted: the snapshot at 13 is stale
	seq.Store(17)
	check(11, []string{"17:A17", "17:B17"}, 2)
	seq.Store(99)
	check(15, []string{"17:A17", "17:B17"}, 2) // the cached one still covers
	st := p.Stats()
	if want := [numSnapshotOutcomes]uint64{2, 2, 0, 0}; st.Snapshots != want || st.ReplayIncomplete != 0 {
		t.Fatalf("snapshots %v incomplete %d, want %v and 0", st.Snapshots, st.ReplayIncomplete, want)
	}
	// A new incarnation: the buffer is complete again from any older seq (its reset batch), and once it rolls over
	// the cached snapshot (as of 17) cannot cover it (everything evicted since is after the reset, so after 17).
	p.PublishReset(18, []byte("r18"))
	waitFor(t, func() bool { return p.Stats().Published == 9 }, "reset published")
	check(11, []string{"18:r18"}, 2)
	p.Publish(19, []byte("b19"))
	p.Publish(20, []byte("b20"))
	p.Publish(21, []byte("b21")) // 18 evicted (steps 2)
	waitFor(t, func() bool { return p.Stats().Published == 12 }, "published")
	seq.Store(21)
	check(11, []string{"21:A21", "21:B21"}, 3)
	p.Publish(22, []byte("b22"))
	p.Publish(23, []byte("b23"))
	p.Publish(24, []byte("b24")) // 22 evicted: the snapshot as of 21 no longer covers
	waitFor(t, func() bool { return p.Stats().Published == 15 }, "published")
	fail.Store(true)
	check(11, []string{"23:b23", "24:b24"}, 4)
	if st := p.Stats(); st.Snapshots[3] != 1 || st.ReplayIncomplete != 1 {
		t.Fatalf("after a failed build: snapshots %v incomplete %d, want 1 unavailable, 1 incomplete", st.Snapshots, st.ReplayIncomplete)
	}
}

// TestSnapshotMidIncarnation: a publisher that began mid-incarnation (no reset batch: a restarted daemon) with an
// empty buffer answered nothing, complete, to a router restarted after it; it now answers the
// snapshot. A consumer already past the snapshot's seq gets an empty, complete reply.
func TestSnapshotMidIncarnation(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 4})
	if got := replayPairs(t, rep, 0); len(got) != 0 || p.Stats().ReplayIncomplete != 1 {
		t.Fatalf("without snapshots: %q, incomplete %d; want nothing, incomplete 1", got, p.Stats().ReplayIncomplete)
	}
	p.SetSnapshotter(func() (Snapshot, error) { return Snapshot{Seq: 5, Batches: [][]byte{[]byte("S")}}, nil }, nil)
	if got := replayPairs(t, rep, 0); !equalStrings(got, []string{"5:S"}) {
		t.Fatalf("replay from 0: %q, want [5:S]", got)
	}
	if got := replayPairs(t, rep, 6); len(got) != 0 {
		t.Fatalf("replay from 6: %q, want nothing", got)
	}
	if st := p.Stats(); st.ReplayIncomplete != 1 || st.Snapshots != [numSnapshotOutcomes]uint64{1, 1, 0, 0} {
		t.Fatalf("incomplete %d snapshots %v, want 1 and [1 1 0 0]", st.ReplayIncomplete, st.Snapshots)
	}
}

// TestSnapshotThrottle: N routers asking one stream at once cost one build (the others wait for it and share
// it), even for a snapshot too large to stay cached; a build on another stream sharing the daemon-wide limit of 1
// waits for the slot, and is counted; every reply is whole once the slot frees. Once no reply uses it, the large
// snapshot is dropped: the next request builds again.
func TestSnapshotThrottle(t *testing.T) {
	lim := NewSnapshotLimit(1)
	type side struct {
		p      *Publisher
		rep    string
		builds atomic.Int32
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	mk := func(name string, block bool) *side {
		s := &side{rep: ipcEndpoint(t, name+"r")}
		s.p = newPub(t, Config{Endpoint: ipcEndpoint(t, name+"p"), ReplayEndpoint: s.rep, BufferSteps: 4})
		s.p.SetSnapshotter(func() (Snapshot, error) {
			s.builds.Add(1)
			if block {
				entered <- struct{}{}
				<-release
			}
			return Snapshot{Seq: 7, Batches: [][]byte{bytes.Repeat([]byte(name), 3)}}, nil
		}, lim)
		s.p.snap.mu.Lock()
		s.p.snap.cacheMax = 2 // bytes: every snapshot here is larger
		s.p.snap.mu.Unlock()
		return s
	}
	a, b := mk("a", true), mk("b", false)
	var wg sync.WaitGroup
	got := make([][]string, 5)
	ask := func(i int, s *side) {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = replayPairs(t, s.rep, 0) }()
	}
	ask(0, a)
	<-entered // a's build holds the only slot
	for i := 1; i < 4; i++ {
		ask(i, a)
	}
	ask(4, b)
	waitFor(t, func() bool { return a.p.snap.joined.Load() == 3 }, "3 replies waiting for a's build")
	waitFor(t, func() bool { return b.p.snap.waiting.Load() == 1 }, "b waiting for a build slot")
	close(release)
	wg.Wait()
	for i, g := range got {
		want := "7:aaa"
		if i == 4 {
			want = "7:bbb"
		}
		if !equalStrings(g, []string{want}) {
			t.Fatalf("reply %d: %q, want [%s]", i, g, want)
		}
	}
	if a.builds.Load() != 1 || b.builds.Load() != 1 {
		t.Fatalf("builds a %d b %d, want 1 and 1", a.builds.Load(), b.builds.Load())
	}
	b.p.snap.mu.Lock()
	kept := b.p.snap.cached
	b.p.snap.mu.Unlock()
	if kept != nil {
		t.Fatal("a snapshot past snapCacheMax is still cached after its reply")
	}
	if got := replayPairs(t, b.rep, 0); !equalStrings(got, []string{"7:bbb"}) || b.builds.Load() != 2 {
		t.Fatalf("after the cap: %q, %d builds; want [7:bbb], 2", got, b.builds.Load())
	}
	if sa, sb := a.p.Stats().Snapshots, b.p.Stats().Snapshots; sa != [numSnapshotOutcomes]uint64{1, 3, 0, 0} ||
		sb != [numSnapshotOutcomes]uint64{1, 0, 1, 0} {
		t.Fatalf("outcomes a %v b %v, want [1 3 0 0] and [1 0 1 0]", sa, sb)
	}
}
