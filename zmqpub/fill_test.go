package zmqpub

import (
	"fmt"
	"testing"
)

// TestContiguousReplies: with a filler, a reply carries every seq from the requested one to the newest published:
// heartbeats' seqs, the seqs before a reset batch and the seqs before a snapshot are filled with the empty batch
// ("-" below), a snapshot's batches take the seqs up to L; a reply whose seqs are not all known, or that would need
// more fillers than the bound, keeps its gaps and is counted (ReplayGapped); without a filler nothing is filled.
func TestContiguousReplies(t *testing.T) {
	tests := []struct {
		name    string
		steps   int
		max     int    // fillers per reply; 0: no filler
		snapAt  uint64 // > 0: a snapshot of 2 batches, A and B, as of this seq
		publish func(*Publisher)
		start   uint64
		want    []string
		filled  uint64
		gapped  uint64
	}{
		{
			name: "heartbeat seqs", steps: 10, max: 100,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				p.Publish(1, []byte("b1"))
				p.PublishHeartbeat(2, []byte("-"))
				p.Publish(3, []byte("b3"))
				p.PublishHeartbeat(4, []byte("-"))
				p.PublishHeartbeat(5, []byte("-"))
			},
			start: 1, want: []string{"1:b1", "2:-", "3:b3", "4:-", "5:-"}, filled: 3,
		},
		{
			name: "heartbeat seqs and a reset from 0, no filler", steps: 10,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				p.PublishHeartbeat(1, []byte("-"))
				p.Publish(2, []byte("b2"))
			},
			start: 0, want: []string{"2:b2"}, // the reset batch only clears: left out from 0
		},
		{
			name: "only heartbeats after start", steps: 10, max: 100,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				p.PublishHeartbeat(1, []byte("-"))
				p.PublishHeartbeat(2, []byte("-"))
			},
			start: 2, want: []string{"2:-"}, filled: 1,
		},
		{
			name: "before a reset batch", steps: 10, max: 100,
			publish: func(p *Publisher) {
				for s := uint64(0); s < 4; s++ {
					p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
				}
				p.PublishReset(4, []byte("r4"))
				p.Publish(5, []byte("b5"))
			},
			start: 1, want: []string{"1:-", "2:-", "3:-", "4:r4", "5:b5"}, filled: 3,
		},
		{
			name: "before a snapshot", steps: 2, max: 100, snapAt: 6,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				for s := uint64(1); s <= 6; s++ {
					p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
				}
				p.PublishHeartbeat(7, []byte("-"))
			},
			// the snapshot holds the state after 6 (its L): A at 5, B at 6; the buffer (5, 6) is not after L
			start: 2, want: []string{"2:-", "3:-", "4:-", "5:A6", "6:B6", "7:-"}, filled: 4,
		},
		{
			name: "over the bound", steps: 2, max: 2, snapAt: 6,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				for s := uint64(1); s <= 6; s++ {
					p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
				}
			},
			start: 1, want: []string{"6:A6", "6:B6"}, gapped: 1,
		},
		{
			name: "more snapshot batches than seqs", steps: 2, max: 100, snapAt: 7,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				for s := uint64(1); s <= 6; s++ {
					p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
				}
				p.Publish(7, make([]byte, 2<<20)) // too large to keep: a hole at 7, so 6 is not enough
			},
			start: 7, want: []string{"7:A7", "7:B7"}, gapped: 1,
		},
		{
			name: "incomplete without snapshot", steps: 2, max: 100,
			publish: func(p *Publisher) {
				p.PublishReset(0, []byte("r0"))
				for s := uint64(1); s <= 4; s++ {
					p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
				}
			},
			start: 1, want: []string{"3:b3", "4:b4"}, gapped: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := ipcEndpoint(t, "replay")
			p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: tt.steps,
				BufferBytes: 1 << 20})
			p.SetFiller([]byte("-"), tt.max)
			if l := tt.snapAt; l > 0 {
				p.SetSnapshotter(func() (Snapshot, error) {
					return Snapshot{Seq: l, Batches: [][]byte{[]byte(fmt.Sprintf("A%d", l)), []byte(fmt.Sprintf("B%d", l))}}, nil
				}, nil)
			}
			tt.publish(p)
			if got := replayPairs(t, rep, tt.start); !equalStrings(got, tt.want) {
				t.Fatalf("replay from %d: %q, want %q", tt.start, got, tt.want)
			}
			st := p.Stats()
			if st.ReplayFilled != tt.filled || st.ReplayGapped != tt.gapped {
				t.Fatalf("filled %d, gapped %d; want %d, %d", st.ReplayFilled, st.ReplayGapped, tt.filled, tt.gapped)
			}
		})
	}
}

// TestFillChunks: a reply of more fillers than one queued chunk holds carries each seq once, in order.
func TestFillChunks(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10})
	p.SetFiller([]byte("-"), 1<<20)
	p.PublishReset(0, []byte("r0"))
	const n = 5000 // ~22 bytes each: several chunks
	for s := uint64(1); s <= n; s++ {
		p.PublishHeartbeat(s, []byte("-"))
	}
	got := replayPairs(t, rep, 1)
	if len(got) != n {
		t.Fatalf("%d messages; want %d", len(got), n)
	}
	if got0 := replayPairs(t, rep, 0); len(got0) != n+1 || got0[0] != "0:-" {
		t.Fatalf("from 0: %d messages, first %q; want %d, the reset batch's seq filled", len(got0), got0[0], n+1)
	}
	for i, g := range got {
		if want := fmt.Sprintf("%d:-", i+1); g != want {
			t.Fatalf("message %d: %q, want %q", i+1, g, want)
		}
	}
}

// TestSnapshotFreshFromZero: a reply from seq 0 sends the snapshot's Fresh batches (nothing of the stream to clear),
// a reply from a later seq its Batches; with a filler the Fresh batches take the seqs up to L as Batches would.
func TestSnapshotFreshFromZero(t *testing.T) {
	for _, fill := range []int{0, 100} {
		rep := ipcEndpoint(t, "replay")
		p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 2})
		p.SetFiller([]byte("-"), fill)
		p.SetSnapshotter(func() (Snapshot, error) {
			return Snapshot{Seq: 6, Batches: [][]byte{[]byte("C+A"), []byte("B")}, Fresh: [][]byte{[]byte("A"), []byte("B")}}, nil
		}, nil)
		p.PublishReset(1, []byte("r1"))
		for s := uint64(2); s <= 6; s++ {
			p.Publish(s, []byte(fmt.Sprintf("b%d", s)))
		}
		want0, want2 := []string{"6:A", "6:B"}, []string{"6:C+A", "6:B"}
		if fill > 0 {
			want0 = []string{"0:-", "1:-", "2:-", "3:-", "4:-", "5:A", "6:B"}
			want2 = []string{"2:-", "3:-", "4:-", "5:C+A", "6:B"}
		}
		if got := replayPairs(t, rep, 0); !equalStrings(got, want0) {
			t.Fatalf("fill %d, from 0: %q, want %q", fill, got, want0)
		}
		if got := replayPairs(t, rep, 2); !equalStrings(got, want2) {
			t.Fatalf("fill %d, from 2: %q, want %q", fill, got, want2)
		}
	}
}

// TestLostSeqsAreNeverFilled: seqs numbered for lost batches (MarkLost) make a reply from at or before them
// incomplete and unfilled (a filler there would tell the consumer it has everything); a reply from after them is
// filled as before.
func TestLostSeqsAreNeverFilled(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10})
	p.SetFiller([]byte("-"), 100)
	p.PublishReset(1, []byte("r1"))
	p.Publish(2, []byte("b2"))
	p.MarkLost(3, 4)
	p.Publish(5, []byte("b5"))
	p.PublishHeartbeat(6, []byte("-"))
	if got, want := replayPairs(t, rep, 2), []string{"2:b2", "5:b5"}; !equalStrings(got, want) {
		t.Fatalf("replay from 2: %q, want %q (the lost seqs a gap)", got, want)
	}
	if st := p.Stats(); st.ReplayIncomplete != 1 || st.ReplayGapped != 1 || st.ReplayFilled != 0 {
		t.Fatalf("incomplete %d, gapped %d, filled %d; want 1, 1, 0", st.ReplayIncomplete, st.ReplayGapped,
			st.ReplayFilled)
	}
	if got, want := replayPairs(t, rep, 5), []string{"5:b5", "6:-"}; !equalStrings(got, want) {
		t.Fatalf("replay from 5: %q, want %q", got, want)
	}
}
