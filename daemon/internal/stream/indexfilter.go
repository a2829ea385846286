package stream

import "github.com/kvshm/kvshm/proto/fbs"

// The device-tree filter (docs/decisions.md): which published events the index gets, as Dynamo 1.6.1's worker side
// decides what enters its device tree (its zmq_wire normalizer). A pure function of the event, its metadata and what
// the stream has learned of its KV-cache groups; doc.go, "Publishing on ZMQ", is the contract.

// Reasons an event is published but not applied to the index (kvshm_events_not_indexed_total{reason}).
const (
	notIndexedMedium    = iota // medium given and not "GPU"
	notIndexedKind             // kv_cache_spec_kind given and not main attention
	notIndexedGroup            // group_idx given, not 0, and not learned as main attention (or learned as not)
	notIndexedBlockSize        // block_size given and not the stream's kv_block_size
	NumNotIndexed
	indexed = -1
)

var NotIndexedLabels = [NumNotIndexed]string{"medium", "kv_cache_spec_kind", "group_idx", "block_size"}

// mainAttention is Dynamo's KvCacheSpecKind::is_main_attention over the wire names.
func mainAttention(kind []byte) bool {
	switch string(kind) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// groupKey identifies a KV-cache group of one dp_rank (Dynamo learns group kinds per (dp_rank, group_idx)).
type groupKey struct {
	rank, group uint32
}

// indexReason applies the filter to one event and its metadata (nil: none): indexed, or the reason it is not.
// learned holds the kinds of the groups seen so far (true = main attention); a Stored event carrying both
// group_idx and kv_cache_spec_kind teaches it, unless its medium excludes it from the device and host tiers (as
// Dynamo's normalizer learns). Owned by the drain goroutine.
func indexReason(kind fbs.Kind, rank uint32, m *fbs.MetaView, blockSize uint32, learned map[groupKey]bool) int {
	if m == nil || kind == fbs.KindCleared {
		return indexed
	}
	if m.HasMedium && string(m.Medium) != "GPU" {
		if kind == fbs.KindStored && string(m.Medium) == "CPU" && m.HasGroupIdx && m.HasKind && learned != nil {
			learned[groupKey{rank, m.GroupIdx}] = mainAttention(m.Kind)
		}
		return notIndexedMedium
	}
	if kind == fbs.KindStored && m.HasGroupIdx && m.HasKind && learned != nil {
		learned[groupKey{rank, m.GroupIdx}] = mainAttention(m.Kind)
	}
	switch {
	case m.HasKind:
		if !mainAttention(m.Kind) {
			return notIndexedKind
		}
	case m.HasGroupIdx:
		main, ok := learned[groupKey{rank, m.GroupIdx}]
		if ok && !main || !ok && m.GroupIdx != 0 {
			return notIndexedGroup
		}
	}
	if m.HasBlockSize && m.BlockSize != blockSize {
		return notIndexedBlockSize
	}
	return indexed
}
