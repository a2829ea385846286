package index

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSetPolicies: changing the loss policy and the dump shape of a live index (as after ReadCheckpoint) takes
// effect at once, the cached dump included.
func TestSetPolicies(t *testing.T) {
	ctx := context.Background()
	ix, err := New(Config{WorkerID: 7, BlockSize: 4, MaxBufferSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(1, 2), toksLE(0, 8), nil, false); err != nil {
		t.Fatal(err)
	}
	ix.MarkLost(2, 2, "ring full")
	dump := func() Response {
		t.Helper()
		r, err := ix.Recover(ctx, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := dump()
	if r.Kind != RespTreeDump || !r.Incomplete || !bytes.Contains(r.JSON, []byte(`"reset_scope":"all"`)) ||
		bytes.Count(r.JSON, []byte(`"block_hash"`)) != 2 || bytes.Count(r.JSON, []byte(`"event_id"`)) != 1 {
		t.Fatalf("default policies: %v incomplete=%v %s", r.Kind, r.Incomplete, r.JSON)
	}
	if !dump().CacheHit {
		t.Fatal("second dump not served from the cache")
	}
	ix.SetPolicies(LossBestEffort, DumpBlocks)
	r = dump()
	if r.CacheHit || r.Kind != RespTreeDump || !r.Incomplete || bytes.Contains(r.JSON, []byte("reset_scope")) ||
		bytes.Contains(r.JSON, []byte("residency_domain")) || bytes.Count(r.JSON, []byte(`"event_id"`)) != 2 {
		t.Fatalf("DumpBlocks: %v cached=%v %s", r.Kind, r.CacheHit, r.JSON)
	}
	ix.SetPolicies(LossError, DumpBlocks)
	if r = dump(); r.Kind != RespError || r.Incomplete || !strings.Contains(string(r.JSON), "event id 2 was lost") {
		t.Fatalf("LossError: %v incomplete=%v %s", r.Kind, r.Incomplete, r.JSON)
	}
	if c := ix.Config(); c.OnLoss != LossError || c.DumpShape != DumpBlocks {
		t.Fatalf("Config() = %+v", c)
	}
}

// TestRejectedIsLost: an event refused as invalid input is a loss: the answers that would include it are
// incomplete (LossBestEffort) and name its id.
func TestRejectedIsLost(t *testing.T) {
	ix, _ := New(Config{WorkerID: 7, BlockSize: 4, MaxBufferSize: 10})
	if _, err := ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(1), toksLE(0, 4), nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.ApplyStoredTokens(2, 0, false, 0, make([]byte, 9), toksLE(0, 4), nil, false); err == nil {
		t.Fatal("9 block hash bytes accepted")
	}
	if _, err := ix.Apply(&Event{ID: 3, Kind: KindRemoved, Hashes: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	start := uint64(1)
	r, err := ix.Recover(context.Background(), &start, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != RespEvents || r.NumEvents != 2 || !r.Incomplete || len(r.Lost) != 1 || r.Lost[0].First != 2 ||
		r.Lost[0].Last != 2 || !strings.Contains(r.Lost[0].Reason, "rejected invalid event") {
		t.Fatalf("%v n=%d incomplete=%v lost=%+v", r.Kind, r.NumEvents, r.Incomplete, r.Lost)
	}
	if st := ix.Stats(); st.Rejected != 1 || st.LostIDs != 1 || !st.Incomplete {
		t.Fatalf("stats %+v", st)
	}
}
