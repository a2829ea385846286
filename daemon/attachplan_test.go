package daemon

import (
	"testing"

	"github.com/kvshm/kvshm/daemon/internal/stream"
)

// TestPlanAttach is the outcome table of doc.go ("Streams and their lifecycle") row by row, without a socket or a
// ring: planAttach decides, install only carries the decision out.
func TestPlanAttach(t *testing.T) {
	tests := []struct {
		name string
		in   attachState
		want attachPlan
	}{
		{"daemon shutting down", attachState{closed: true, stream: true, producer: producerLive},
			attachPlan{outcome: attachBusy}},
		{"shutting down wins over a fresh stream", attachState{closed: true},
			attachPlan{outcome: attachBusy}},
		{"previous producer ending: wait for its final drain", attachState{stream: true, producer: producerEnding, streamEpoch: 3, ringEpoch: 3},
			attachPlan{outcome: attachWait}},
		{"live producer on the key: conflict", attachState{stream: true, producer: producerLive, streamEpoch: 3, ringEpoch: 4},
			attachPlan{outcome: attachConflict}},
		{"first attach, head 0", attachState{ringEpoch: 7},
			attachPlan{outcome: attachFirst, clearCkpts: true}},
		{"first attach, head 0, checkpoint looked up (not missing) but not used", attachState{ringEpoch: 7, lookedUp: true},
			attachPlan{outcome: attachFirst, countRestore: true, clearCkpts: true}},
		{"first attach, head > 0, usable checkpoint", attachState{ringEpoch: 7, head: 4096, lookedUp: true, restorable: true},
			attachPlan{outcome: attachRestore, resumed: true, countRestore: true, clearCkpts: true}},
		{"first attach, head > 0, usable checkpoint, --checkpoint-interval keeps it", attachState{ringEpoch: 7, head: 4096, lookedUp: true, restorable: true, interval: true},
			attachPlan{outcome: attachRestore, resumed: true, countRestore: true, keepCkpt: true, clearCkpts: true}},
		{"first attach, head > 0, no usable checkpoint", attachState{ringEpoch: 7, head: 4096, lookedUp: true},
			attachPlan{outcome: attachUnknown, resumed: true, taint: true, countRestore: true, clearCkpts: true}},
		{"first attach, head > 0, no --state-dir", attachState{ringEpoch: 7, head: 4096},
			attachPlan{outcome: attachUnknown, resumed: true, taint: true, clearCkpts: true}},
		{"reattach, same ring epoch", attachState{stream: true, streamEpoch: 7, ringEpoch: 7, head: 4096},
			attachPlan{outcome: attachReattach, resumed: true}},
		{"reattach at head 0 is still resumed", attachState{stream: true, streamEpoch: 7, ringEpoch: 7},
			attachPlan{outcome: attachReattach, resumed: true}},
		{"reattach after a checkpoint moved the reader, stream created meanwhile", attachState{stream: true, streamEpoch: 7, ringEpoch: 7, head: 4096, lookedUp: true, restorable: true, moved: true},
			attachPlan{outcome: attachReattach, resumed: true, taint: true}},
		{"producer restart (new ring epoch), head 0", attachState{stream: true, streamEpoch: 7, ringEpoch: 8},
			attachPlan{outcome: attachRestart, clearCkpts: true}},
		{"producer restart resumed at head > 0", attachState{stream: true, streamEpoch: 7, ringEpoch: 8, head: 64},
			attachPlan{outcome: attachRestart, resumed: true, taint: true, clearCkpts: true}},
		{"restart does not count a lookup made before the stream existed", attachState{stream: true, streamEpoch: 7, ringEpoch: 8, head: 64, lookedUp: true},
			attachPlan{outcome: attachRestart, resumed: true, taint: true, clearCkpts: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := planAttach(tc.in); got != tc.want {
				t.Fatalf("planAttach(%+v)\n got %+v (%s)\nwant %+v (%s)", tc.in, got, got.outcome, tc.want, tc.want.outcome)
			}
		})
	}
}

// TestPlanInstall: what install does for each outcome that installs an attachment (planInstall), without a socket
// or a ring: which index the stream gets, how the attach relates to the producer's incarnation, the taint and the
// checkpoint's story in the warning.
func TestPlanInstall(t *testing.T) {
	unusable := &ckptLoad{why: "checkpoint head 64 is not the ring's head 128"}
	tests := []struct {
		name string
		in   installInput
		want installPlan
	}{
		{"first attach: a new stream, an incarnation begins", installInput{plan: attachPlan{outcome: attachFirst}},
			installPlan{newStream: true, start: stream.StartBegin}},
		{"restore: the checkpoint's index, the incarnation continues", installInput{plan: attachPlan{outcome: attachRestore}, head: 4096},
			installPlan{newStream: true, restore: true, start: stream.StartContinue}},
		{"unknown history, no --state-dir", installInput{plan: attachPlan{outcome: attachUnknown}, head: 4096},
			installPlan{newStream: true, start: stream.StartContinue, why: "no --state-dir",
				taint: "daemon resumed ring at head 4096: events consumed by an earlier daemon are gone"}},
		{"unknown history, the stream existed when the lookup would have run", installInput{plan: attachPlan{outcome: attachUnknown}, head: 8, stateDir: true},
			installPlan{newStream: true, start: stream.StartContinue, why: "checkpoint not looked up (the stream existed when the attach began)",
				taint: "daemon resumed ring at head 8: events consumed by an earlier daemon are gone"}},
		{"unknown history, the lookup says why", installInput{plan: attachPlan{outcome: attachUnknown}, head: 128, stateDir: true, ck: unusable},
			installPlan{newStream: true, start: stream.StartContinue, why: unusable.why,
				taint: "daemon resumed ring at head 128: events consumed by an earlier daemon are gone"}},
		{"reattach", installInput{plan: attachPlan{outcome: attachReattach, resumed: true}, head: 64},
			installPlan{start: stream.StartReattach}},
		{"reattach past an unused checkpoint", installInput{plan: attachPlan{outcome: attachReattach, resumed: true, taint: true}, head: 64},
			installPlan{start: stream.StartReattach, taint: "ring resumed at checkpoint head 64, but the checkpoint was not used"}},
		{"producer restart at head 0", installInput{plan: attachPlan{outcome: attachRestart}},
			installPlan{restart: true, start: stream.StartBegin}},
		{"producer restart resumed at head > 0", installInput{plan: attachPlan{outcome: attachRestart, resumed: true, taint: true}, head: 64},
			installPlan{restart: true, start: stream.StartBegin, taint: "new ring epoch resumed at head 64"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := planInstall(tc.in); got != tc.want {
				t.Fatalf("planInstall(%+v)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
		})
	}
	for _, o := range []attachOutcome{attachBusy, attachWait, attachConflict} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("planInstall(%s) did not panic: the outcome installs nothing", o)
				}
			}()
			planInstall(installInput{plan: attachPlan{outcome: o}})
		}()
	}
}
