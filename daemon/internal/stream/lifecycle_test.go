package stream

import "testing"

// TestPlanStart: how an attach starts the producer's incarnation and the stream's wire counter
// (docs/lifecycle.md, "Incarnations" and "Wire seqs"), state by state; the scripts (testdata/) show the same
// through a stream's life.
func TestPlanStart(t *testing.T) {
	tests := []struct {
		name string
		in   startState
		want startPlan
	}{
		{"begin, not published", startState{start: StartBegin},
			startPlan{begins: true, every: IdleEvery, seqs: seqFromIndex}},
		{"begin, published: the clock, the start Cleared, loss bookkeeping from nothing", startState{start: StartBegin, publishing: true, wire: 9},
			startPlan{begins: true, rebase: true, every: PublishIdleEvery, seqs: seqFromNone}},
		{"continue (daemon restart), not published", startState{start: StartContinue, live: true},
			startPlan{every: IdleEvery, seqs: seqFromIndex}},
		{"continue, published: the clock, no Cleared", startState{start: StartContinue, publishing: true},
			startPlan{rebase: true, every: PublishIdleEvery, seqs: seqFromNone}},
		{"continue a restored index, published: its wire seqs, then the clock", startState{start: StartContinue, restored: true, publishing: true},
			startPlan{wireFromIndex: true, rebase: true, every: PublishIdleEvery, seqs: seqFromNone}},
		{"restored, not published: the index speaks the engine's seqs", startState{start: StartContinue, restored: true},
			startPlan{every: IdleEvery, seqs: seqFromIndex}},
		{"reattach, live", startState{start: StartReattach, live: true},
			startPlan{every: IdleEvery, seqs: seqFromIndex}},
		{"reattach after the end was seen: an incarnation begins", startState{start: StartReattach},
			startPlan{begins: true, every: IdleEvery, seqs: seqFromIndex}},
		{"reattach, live, published: the counter and the previous attachment's engine seqs go on", startState{start: StartReattach, live: true, publishing: true, wire: 40},
			startPlan{every: PublishIdleEvery, seqs: seqFromPrevious}},
		{"reattach, live, published, never published a seq: the clock", startState{start: StartReattach, live: true, publishing: true},
			startPlan{rebase: true, every: PublishIdleEvery, seqs: seqFromPrevious}},
		{"reattach after the end, published: the clock, the start Cleared", startState{start: StartReattach, publishing: true, wire: 40},
			startPlan{begins: true, rebase: true, every: PublishIdleEvery, seqs: seqFromNone}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := planStart(tc.in); got != tc.want {
				t.Fatalf("planStart(%+v)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
		})
	}
}
