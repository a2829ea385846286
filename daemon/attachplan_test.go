package daemon

import "testing"

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
