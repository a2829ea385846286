package stream

import (
	"fmt"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/vllmwire"
)

// checkHashBytes checks the bytes block hashes a META gives its event (vLLM with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, proto/fbs/event.fbs): one length for all of the event's hashes (none for
// an event without blocks), each the bytes of the event's key at its position (vllmwire.HashKey), and a parent's
// bytes only on a Stored event that has a parent, with its key. The index applies the keys and the ZMQ stream
// sends the bytes, so a batch where they disagree is malformed: skipped whole, as any other.
func checkHashBytes(v *fbs.EventView, m *fbs.MetaView) error {
	if hb := m.HashBytes; hb != nil {
		n := v.NumBlocks()
		if v.Kind == fbs.KindCleared || n == 0 && len(hb) != 0 || n != 0 && len(hb)%n != 0 {
			return fmt.Errorf("%w: %d bytes of block hashes for %d blocks", errBatch, len(hb), n)
		}
		if n != 0 {
			size := len(hb) / n
			for i := range n {
				if k := vllmwire.HashKey(hb[i*size : (i+1)*size]); k != v.BlockHash(i) {
					return fmt.Errorf("%w: block hash %d is %#x, its bytes' key %#x", errBatch, i, v.BlockHash(i), k)
				}
			}
		}
	}
	if pb := m.ParentBytes; pb != nil {
		if v.Kind != fbs.KindStored || !v.HasParent {
			return fmt.Errorf("%w: parent hash bytes for an event without a parent", errBatch)
		}
		if k := vllmwire.HashKey(pb); k != v.ParentHash {
			return fmt.Errorf("%w: parent hash is %#x, its bytes' key %#x", errBatch, v.ParentHash, k)
		}
	}
	return nil
}
