package stream

import (
	"testing"

	"github.com/kvshm/kvshm/proto/fbs"
)

// TestIndexReason is the device-tree filter's table (Dynamo's ZmqEventNormalizer filter, zmq_wire/mod.rs).
func TestIndexReason(t *testing.T) {
	gpu, cpu := []byte("GPU"), []byte("CPU")
	full, sw := []byte("full_attention"), []byte("sliding_window")
	cases := []struct {
		name    string
		kind    fbs.Kind
		m       *fbs.MetaView
		learned map[groupKey]bool
		want    int
	}{
		{"no meta", fbs.KindStored, nil, nil, indexed},
		{"GPU", fbs.KindStored, &fbs.MetaView{HasMedium: true, Medium: gpu}, nil, indexed},
		{"medium None", fbs.KindStored, &fbs.MetaView{}, nil, indexed},
		{"CPU", fbs.KindStored, &fbs.MetaView{HasMedium: true, Medium: cpu}, nil, notIndexedMedium},
		{"removed CPU", fbs.KindRemoved, &fbs.MetaView{HasMedium: true, Medium: cpu}, nil, notIndexedMedium},
		{"cleared ignores meta", fbs.KindCleared, &fbs.MetaView{HasMedium: true, Medium: cpu}, nil, indexed},
		{"main kind", fbs.KindStored, &fbs.MetaView{HasKind: true, Kind: full, HasGroupIdx: true, GroupIdx: 3}, nil, indexed},
		{"mla kind", fbs.KindStored, &fbs.MetaView{HasKind: true, Kind: []byte("mla_attention")}, nil, indexed},
		{"sliding window kind", fbs.KindStored, &fbs.MetaView{HasKind: true, Kind: sw}, nil, notIndexedKind},
		{"unknown kind", fbs.KindStored, &fbs.MetaView{HasKind: true, Kind: []byte("new_kind")}, nil, notIndexedKind},
		{"group 0 unlearned", fbs.KindRemoved, &fbs.MetaView{HasGroupIdx: true}, nil, indexed},
		{"group 1 unlearned", fbs.KindRemoved, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 1}, nil, notIndexedGroup},
		{"group 1 learned main", fbs.KindRemoved, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 1}, map[groupKey]bool{{0, 1}: true}, indexed},
		{"group 0 learned not main", fbs.KindRemoved, &fbs.MetaView{HasGroupIdx: true}, map[groupKey]bool{{0, 0}: false}, notIndexedGroup},
		{"group learned on another rank", fbs.KindRemoved, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 1}, map[groupKey]bool{{1, 1}: true}, notIndexedGroup},
		{"block size differs", fbs.KindStored, &fbs.MetaView{HasBlockSize: true, BlockSize: 8}, nil, notIndexedBlockSize},
		{"block size same", fbs.KindStored, &fbs.MetaView{HasBlockSize: true, BlockSize: 4}, nil, indexed},
	}
	for _, c := range cases {
		learned := map[groupKey]bool{}
		for k, v := range c.learned {
			learned[k] = v
		}
		if got := indexReason(c.kind, 0, c.m, 4, learned); got != c.want {
			t.Errorf("%s: indexReason = %d, want %d", c.name, got, c.want)
		}
	}
	// Learning: a Stored event with group and kind teaches the group's kind to later events of its rank.
	learned := map[groupKey]bool{}
	indexReason(fbs.KindStored, 2, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 5, HasKind: true, Kind: full}, 4, learned)
	indexReason(fbs.KindStored, 2, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 6, HasKind: true, Kind: sw}, 4, learned)
	if got := indexReason(fbs.KindRemoved, 2, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 5}, 4, learned); got != indexed {
		t.Errorf("removal in a group learned as main attention: %d, want indexed", got)
	}
	if got := indexReason(fbs.KindRemoved, 2, &fbs.MetaView{HasGroupIdx: true, GroupIdx: 6}, 4, learned); got != notIndexedGroup {
		t.Errorf("removal in a group learned as sliding window: %d, want group_idx", got)
	}
}
