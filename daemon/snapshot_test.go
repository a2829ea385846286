package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvshm/kvshm/internal/wiretest"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/vllmwire"
)

// replayBatches sends a replay request from start and returns the reply's (seq, decoded batch) pairs.
func replayBatches(t *testing.T, rep string, start uint64) ([]uint64, []vllmwire.Batch) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, start))); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var out []vllmwire.Batch
	for {
		r, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Frames) != 4 {
			t.Fatalf("reply frames %d, want 4", len(r.Frames))
		}
		if len(r.Frames[3]) == 0 {
			return seqs, out
		}
		b, err := vllmwire.Decode(r.Frames[3])
		if err != nil {
			t.Fatalf("decode replayed batch: %v", err)
		}
		seqs = append(seqs, binary.BigEndian.Uint64(r.Frames[2]))
		out = append(out, b)
	}
}

// TestZmqSnapshotReply: a publishing stream whose replay buffer rolled over answers a replay from before it with
// the state as of the last batch L (one batch, seq L: AllBlocksCleared, then the resident chains with their
// tokens, parents first), then the batches after L; with --zmq-snapshots=false the reply is the buffer only, as
// before.
func TestZmqSnapshotReply(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("snapshots=%v", on), func(t *testing.T) {
			ts := startServer(t, func(c *Config) { c.ZMQNoSnapshots = !on })
			p := newProducer(t, ts.cfg.SocketPath, 5, 4, 1<<20)
			dir := t.TempDir()
			rep := "ipc://" + filepath.Join(dir, "r.sock")
			attachPublishing(t, p, &sock.Publish{Endpoint: "ipc://" + filepath.Join(dir, "p.sock"), ReplayEndpoint: &rep,
				Topic: "kv", BufferSteps: 2})
			first := nextWire(t, ts, 5) - 1 // the incarnation's Cleared
			p.mustPublish(stored(1, 0, nil, []uint64{101, 102}, tokens(0, 2, 4)))
			p.mustPublish(stored(2, 0, u64p(102), []uint64{103}, tokens(100, 1, 4)))
			p.mustPublish(stored(3, 0, nil, []uint64{201}, tokens(200, 1, 4)))
			p.mustPublish(removed(4, 0, 201))
			last := nextWire(t, ts, 5) - 1
			st := ts.streams[keyOf(5, nil)]
			waitUntil(t, func() bool { return st.Publisher().Stats().Published == 5 }, "5 batches published")
			seqs, batches := replayBatches(t, rep, first)
			if !on {
				if !slices.Equal(seqs, []uint64{last - 1, last}) || st.Publisher().Stats().ReplayIncomplete != 1 {
					t.Fatalf("without snapshots: seqs %v (want %d, %d), incomplete %d", seqs, last-1, last,
						st.Publisher().Stats().ReplayIncomplete)
				}
				return
			}
			if !slices.Equal(seqs, []uint64{last}) {
				t.Fatalf("seqs %v, want [%d] (the snapshot as of the last batch; nothing after it)", seqs, last)
			}
			want := []string{"AllBlocksCleared",
				"BlockStored [101 102 103] parent false/0 tokens [0 1 2 3 4 5 6 7 100 101 102 103] bs 4 medium \"GPU\""}
			if got := wiretest.Describe(batches[0]); !slices.Equal(got, want) || !batches[0].HasDpRank || batches[0].DpRank != 0 {
				t.Fatalf("snapshot batch %q rank %v/%d, want %q rank 0", got, batches[0].HasDpRank, batches[0].DpRank, want)
			}
			// A batch after the snapshot follows it in the next reply from the same old seq (the snapshot is shared).
			p.mustPublish(stored(5, 0, u64p(103), []uint64{104}, tokens(300, 1, 4)))
			next := nextWire(t, ts, 5) - 1
			waitUntil(t, func() bool { return st.Publisher().Stats().Published == 6 }, "6 batches published")
			seqs, batches = replayBatches(t, rep, first)
			if !slices.Equal(seqs, []uint64{last, next}) || !bytes.Contains([]byte(fmt.Sprint(wiretest.Describe(batches[1]))), []byte("[104]")) {
				t.Fatalf("seqs %v (want %d, %d), tail %q", seqs, last, next, wiretest.Describe(batches[1]))
			}
			if s := st.Publisher().Stats(); s.Snapshots != [4]uint64{1, 1, 0, 0} || s.ReplayIncomplete != 0 {
				t.Fatalf("snapshots %v incomplete %d, want [1 1 0 0] and 0", s.Snapshots, s.ReplayIncomplete)
			}
		})
	}
}

// waitUntil polls cond (a hang guard of 20 s, not a performance bound).
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
