package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/kvshm/kvshm/index"
)

// A TreeDump's bytes depend on the dump cache's history (Dynamo extends a cached dump with the log tail, so the
// same state can be dumped in several ways), so tests compare dumps by what they describe: each dump is replayed
// into a fresh index (what a consumer does), that index is dumped afresh, and the resulting tree edges
// (dp_rank, parent, block_hash, tokens_hash) are compared as sets, with last_event_id. This equivalence holds
// only when no two blocks share a tokens_hash under one parent: Dynamo's tree then reuses the existing node and
// aliases the new block hash to it in the lookup, which no dump can express, so later events that name the alias
// replay differently (a property of the reference design, not of kvshm).

type routerEvent struct {
	Event struct {
		Data struct {
			Stored *struct {
				ParentHash *uint64 `json:"parent_hash"`
				Blocks     []struct {
					BlockHash  uint64 `json:"block_hash"`
					TokensHash uint64 `json:"tokens_hash"`
				} `json:"blocks"`
			} `json:"stored"`
			Removed *struct {
				BlockHashes []uint64 `json:"block_hashes"`
			} `json:"removed"`
			Cleared json.RawMessage `json:"cleared"`
		} `json:"data"`
		DpRank uint32 `json:"dp_rank"`
	} `json:"event"`
}

type edge struct {
	dp           uint32
	root         bool
	parent, hash uint64
	tokens       uint64
}

func parseDump(t *testing.T, body []byte) ([]routerEvent, uint64) {
	t.Helper()
	var resp struct {
		TreeDump *struct {
			Events      []routerEvent `json:"events"`
			LastEventID uint64        `json:"last_event_id"`
		}
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.TreeDump == nil {
		t.Fatalf("not a TreeDump: %.200s (%v)", body, err)
	}
	return resp.TreeDump.Events, resp.TreeDump.LastEventID
}

// dumpEdges replays a TreeDump into a fresh index and returns the edges of that index's own fresh dump.
func dumpEdges(t *testing.T, body []byte) (map[edge]bool, uint64) {
	t.Helper()
	evs, last := parseDump(t, body)
	ix, err := index.New(index.Config{WorkerID: 1, BlockSize: 1, MaxBufferSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		ie := index.Event{ID: uint64(i), DpRank: ev.Event.DpRank}
		switch d := ev.Event.Data; {
		case d.Stored != nil:
			ie.Kind = index.KindStored
			if d.Stored.ParentHash != nil {
				ie.HasParent, ie.Parent = true, *d.Stored.ParentHash
			}
			for _, b := range d.Stored.Blocks {
				ie.Blocks = append(ie.Blocks, index.Block{BlockHash: b.BlockHash, TokensHash: b.TokensHash})
			}
		case d.Removed != nil:
			ie.Kind, ie.Hashes = index.KindRemoved, d.Removed.BlockHashes
		default:
			ie.Kind = index.KindCleared
		}
		_, _ = ix.Apply(&ie) // tree errors are part of the replay, as for a consumer
	}
	fresh, err := ix.Recover(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fevs, _ := parseDump(t, fresh.JSON)
	edges := map[edge]bool{}
	for _, ev := range fevs {
		st := ev.Event.Data.Stored
		if st == nil {
			t.Fatalf("a fresh dump holds only stored events: %s", fresh.JSON)
		}
		e := edge{dp: ev.Event.DpRank, root: st.ParentHash == nil}
		if st.ParentHash != nil {
			e.parent = *st.ParentHash
		}
		for _, b := range st.Blocks {
			e.hash, e.tokens = b.BlockHash, b.TokensHash
			edges[e] = true
			e.parent, e.root = b.BlockHash, false
		}
	}
	return edges, last
}

// sameRecovery compares two WorkerKvQueryResponse bodies: TreeDumps by content, everything else byte for byte.
func sameRecovery(t *testing.T, got, want []byte) bool {
	t.Helper()
	if !bytes.HasPrefix(want, []byte(`{"TreeDump":`)) || !bytes.HasPrefix(got, []byte(`{"TreeDump":`)) {
		return bytes.Equal(got, want)
	}
	ge, gl := dumpEdges(t, got)
	we, wl := dumpEdges(t, want)
	if gl != wl || len(ge) != len(we) {
		return false
	}
	for e := range we {
		if !ge[e] {
			return false
		}
	}
	return true
}
func TestDumpModel(t *testing.T) {
	a := []byte(`{"TreeDump":{"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":5,"tokens_hash":50,"mm_extra_info":null},{"block_hash":6,"tokens_hash":60,"mm_extra_info":null}]}},"dp_rank":0}}],"last_event_id":3}}`)
	// The same state as a cached dump extended by a store and a remove.
	b := []byte(`{"TreeDump":{"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":5,"tokens_hash":50,"mm_extra_info":null}]}},"dp_rank":0}},{"worker_id":1,"storage_tier":"device","event":{"event_id":2,"data":{"stored":{"parent_hash":5,"start_position":null,"blocks":[{"block_hash":6,"tokens_hash":60,"mm_extra_info":null},{"block_hash":7,"tokens_hash":70,"mm_extra_info":null}]}},"dp_rank":0}},{"worker_id":1,"storage_tier":"device","event":{"event_id":3,"data":{"removed":{"block_hashes":[7]}},"dp_rank":0}}],"last_event_id":3}}`)
	if !sameRecovery(t, a, b) {
		t.Fatal("equivalent dumps compared different")
	}
	c := bytes.Replace(b, []byte(`"tokens_hash":60`), []byte(`"tokens_hash":61`), 1)
	if sameRecovery(t, a, c) {
		t.Fatal("dumps with different tokens_hash compared equal")
	}
}
