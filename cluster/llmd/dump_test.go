package main

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/llm-d/llm-d-router/pkg/kvevents"
	"github.com/vmihailenco/msgpack/v5"
)

// A vLLM KVEventBatch as vLLM's msgspec encodes it (array_like, tagged events), as the pool receives it.
func batch(t *testing.T, rank int, events ...any) []byte {
	t.Helper()
	raw := make([]msgpack.RawMessage, len(events))
	for i, e := range events {
		b, err := msgpack.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		raw[i] = b
	}
	b, err := msgpack.Marshal([]any{1.0, raw, rank})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stored is a BlockStored of one block per hash, each block's tokens unique (as the cluster's producers make them).
func stored(parent any, hashes ...uint64) []any {
	var tokens []uint32
	for _, h := range hashes {
		tokens = append(tokens, uint32(h), uint32(h>>32), 1, 2)
	}
	return []any{"BlockStored", hashes, parent, tokens, 4, nil, "GPU", nil}
}

func removed(hashes ...uint64) []any { return []any{"BlockRemoved", hashes, "GPU"} }

func cleared() []any { return []any{"AllBlocksCleared"} }

// storedMap is stored in vLLM >= 0.32's field-name layout.
func storedMap(hashes ...uint64) map[string]any {
	ev := stored(nil, hashes...)
	return map[string]any{"type": ev[0], "block_hashes": ev[1], "parent_block_hash": ev[2], "token_ids": ev[3],
		"block_size": ev[4], "medium": ev[6]}
}

// msg is one batch as a subscriber hands it to the pool; source is its SourceEndpoint (router.subscribe's pod).
type msg struct {
	topic  string
	source string
	ev     []any
}

// TestDumpIsWhatLlmdHolds runs llm-d's pool and index on vLLM batches and reads /dump's holdings: per pod "W-R" the
// engine hashes whose request keys llm-d's index holds for that pod.
func TestDumpIsWhatLlmdHolds(t *testing.T) {
	cases := []struct {
		name string
		msgs []msg
		want map[podKey][]uint64
	}{
		{"a chain per rank", []msg{
			{"kv@100-0@cluster", "", []any{stored(nil, 11, 12), stored(uint64(12), 13)}},
			{"kv@100-1@cluster", "", []any{stored(nil, 21)}},
		}, map[podKey][]uint64{{100, 0}: {11, 12, 13}, {100, 1}: {21}}},
		{"removed leaves the rest", []msg{
			{"kv@100-0@cluster", "", []any{stored(nil, 11, 12), stored(uint64(12), 13), removed(13)}},
		}, map[podKey][]uint64{{100, 0}: {11, 12}}},
		{"cleared empties one pod only", []msg{
			{"kv@100-0@cluster", "", []any{stored(nil, 11)}},
			{"kv@200-0@cluster", "", []any{stored(nil, 31)}},
			{"kv@100-0@cluster", "", []any{cleared(), stored(nil, 14)}},
		}, map[podKey][]uint64{{100, 0}: {14}, {200, 0}: {31}}},
		{"a store under an unknown parent is dropped by llm-d", []msg{
			{"kv@100-0@cluster", "", []any{stored(uint64(99), 15), stored(nil, 16)}},
		}, map[podKey][]uint64{{100, 0}: {16}}},
		{"a pod that is not W-R is worker -1", []msg{
			{"kv@vllm-pod@cluster", "", []any{stored(nil, 17)}},
		}, map[podKey][]uint64{{-1, 0}: {17}}},
		{"re-stored after cleared is held again", []msg{
			{"kv@100-0@cluster", "", []any{stored(nil, 11), cleared()}},
			{"kv@100-0@cluster", "", []any{stored(nil, 11)}},
		}, map[podKey][]uint64{{100, 0}: {11}}},
		{"the subscriber's source endpoint names the pod, not the topic", []msg{
			{"kv@100-0@cluster", "200-1", []any{stored(nil, 11)}},
		}, map[podKey][]uint64{{200, 1}: {11}}},
		{"field-name maps decode as arrays do", []msg{
			{"kv@100-0@cluster", "", []any{storedMap(11, 12), removed(12)}},
		}, map[podKey][]uint64{{100, 0}: {11}}},
		{"a block stored twice is held until removed twice", []msg{
			{"kv@100-0@cluster", "", []any{stored(nil, 11), stored(nil, 11), removed(11)}},
			{"kv@100-0@cluster", "", []any{stored(nil, 12), stored(nil, 12), removed(12), removed(12)}},
		}, map[podKey][]uint64{{100, 0}: {11}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rt, err := newRouter(ctx, 4, "cluster")
			if err != nil {
				t.Fatal(err)
			}
			rt.pool.Start(ctx)
			for i, m := range tc.msgs {
				rt.pool.AddTask(&kvevents.RawMessage{Topic: m.topic, Sequence: uint64(i), Payload: batch(t, 0, m.ev...),
					SourceEndpoint: m.source})
			}
			rt.pool.Shutdown(ctx) // drains every queued message
			got := rt.index.holdings(ctx)
			if len(got) == 0 {
				got = map[podKey][]uint64{}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("holdings %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDumpShape: the document router.py's dump_state reads (worker_id, event.dp_rank, data.stored.blocks).
func TestDumpShape(t *testing.T) {
	b, err := json.Marshal(dumpDoc("m", 4, map[podKey][]uint64{{200, 0}: {5}, {100, 1}: {6, 7}}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"m:llmd":{"block_size":4,"events":[` +
		`{"worker_id":100,"event":{"event_id":0,"dp_rank":1,"data":{"stored":{"parent_hash":null,"blocks":[` +
		`{"block_hash":6,"tokens_hash":0},{"block_hash":7,"tokens_hash":0}]}}}},` +
		`{"worker_id":200,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":[` +
		`{"block_hash":5,"tokens_hash":0}]}}}}]}}`
	if string(b) != want {
		t.Fatalf("dump\n%s\nwant\n%s", b, want)
	}
}

func TestParsePod(t *testing.T) {
	for in, want := range map[string]podKey{"100-1": {100, 1}, "7-0": {7, 0}, "x": {-1, 0}, "1-a": {-1, 0}, "": {-1, 0}} {
		if got := parsePod(in); got != want {
			t.Errorf("parsePod(%q) = %v, want %v", in, got, want)
		}
	}
}
