package stream

import (
	"bytes"
	"testing"

	"github.com/kvshm/kvshm/vllmwire"
)

// TestClearedBatchInStreamWire: the Cleared that starts or ends an incarnation is encoded in the stream's layout
// (a consumer that decodes only WireArray, llm-d's, must read it: the engine-restart repair rests on it).
func TestClearedBatchInStreamWire(t *testing.T) {
	for _, w := range []vllmwire.Wire{vllmwire.Wire033, vllmwire.Wire032, vllmwire.WireArray} {
		b := clearedBatch(nil, 3, w)
		ev := w.AppendEvent(nil, &vllmwire.Event{Kind: vllmwire.KindCleared})
		// [ts (float64: 9 bytes), [event], 3]: 0x93, ts, 0x91, event, 0x03.
		if len(b) != 1+9+1+len(ev)+1 || !bytes.Equal(b[11:11+len(ev)], ev) || b[len(b)-1] != 3 {
			t.Fatalf("wire %v: clearedBatch % x, want the Cleared % x", w, b, ev)
		}
	}
}
