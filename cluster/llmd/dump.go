package main

import (
	"sort"
)

// The /dump document: Dynamo's standalone indexer's shape (cluster/kvshm_cluster/router.py reads it), one Stored
// event per (worker, dp_rank) with every block llm-d holds for it.
type dumpBlock struct {
	BlockHash  uint64 `json:"block_hash"`
	TokensHash uint64 `json:"tokens_hash"`
}

type dumpStored struct {
	ParentHash *uint64     `json:"parent_hash"`
	Blocks     []dumpBlock `json:"blocks"`
}

type dumpData struct {
	Stored dumpStored `json:"stored"`
}

type dumpEventBody struct {
	EventID int64    `json:"event_id"`
	DPRank  int64    `json:"dp_rank"`
	Data    dumpData `json:"data"`
}

type dumpEvent struct {
	WorkerID int64         `json:"worker_id"`
	Event    dumpEventBody `json:"event"`
}

type dumpEntry struct {
	BlockSize int         `json:"block_size"`
	Events    []dumpEvent `json:"events"`
}

// dumpDoc renders holdings as {"<model>:llmd": {"block_size": B, "events": [...]}}, events ordered by (worker,
// rank). tokens_hash is 0: llm-d keeps no per-block token hash the judge could use.
func dumpDoc(model string, blockSize int, held map[podKey][]uint64) map[string]dumpEntry {
	keys := make([]podKey, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].worker != keys[j].worker {
			return keys[i].worker < keys[j].worker
		}
		return keys[i].rank < keys[j].rank
	})
	events := make([]dumpEvent, 0, len(keys))
	for i, k := range keys {
		blocks := make([]dumpBlock, len(held[k]))
		for j, h := range held[k] {
			blocks[j] = dumpBlock{BlockHash: h}
		}
		events = append(events, dumpEvent{WorkerID: k.worker, Event: dumpEventBody{
			EventID: int64(i), DPRank: k.rank, Data: dumpData{Stored: dumpStored{Blocks: blocks}},
		}})
	}
	return map[string]dumpEntry{model + ":llmd": {BlockSize: blockSize, Events: events}}
}
