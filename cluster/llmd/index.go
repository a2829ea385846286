package main

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/llm-d/llm-d-router/pkg/kvcache/kvblock"
)

// seenIndex is llm-d's index with the set of engine keys ever added beside it, for /dump (doc.go).
type seenIndex struct {
	kvblock.Index
	mu   sync.Mutex
	seen map[kvblock.BlockHash]struct{}
}

func newSeenIndex(inner kvblock.Index) *seenIndex {
	return &seenIndex{Index: inner, seen: make(map[kvblock.BlockHash]struct{})}
}

// Add records the engine keys, then passes the call through.
func (s *seenIndex) Add(ctx context.Context, engineKeys, requestKeys []kvblock.BlockHash,
	entries []kvblock.PodEntry,
) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ek := range engineKeys {
		s.seen[ek] = struct{}{}
	}
	return s.Index.Add(ctx, engineKeys, requestKeys, entries)
}

// podKey is a (worker, dp_rank) of the cluster; pod identities that are not "W-R" map to (-1, 0).
type podKey struct {
	worker int64
	rank   int64
}

// String is the cluster's pod identity "W-R".
func (k podKey) String() string {
	return strconv.FormatInt(k.worker, 10) + "-" + strconv.FormatInt(k.rank, 10)
}

// parsePod reads the cluster's pod identity "W-R".
func parsePod(id string) podKey {
	w, r, ok := strings.Cut(id, "-")
	if ok {
		wi, err1 := strconv.ParseInt(w, 10, 64)
		ri, err2 := strconv.ParseInt(r, 10, 64)
		if err1 == nil && err2 == nil {
			return podKey{wi, ri}
		}
	}
	return podKey{-1, 0}
}

// holdings is, per (worker, dp_rank), the engine hashes llm-d's index holds for it, sorted. Engine keys llm-d no
// longer maps or no pod holds are forgotten (an Add of them records them again).
func (s *seenIndex) holdings(ctx context.Context) map[podKey][]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[podKey][]uint64)
	for ek := range s.seen {
		rk, err := s.Index.GetRequestKey(ctx, ek)
		if err != nil {
			delete(s.seen, ek)
			continue
		}
		pods, err := s.Index.Lookup(ctx, []kvblock.BlockHash{rk}, nil)
		if err != nil || len(pods[rk]) == 0 {
			delete(s.seen, ek)
			continue
		}
		held := make(map[podKey]bool)
		for _, e := range pods[rk] {
			held[parsePod(e.PodIdentifier)] = true
		}
		for k := range held {
			out[k] = append(out[k], uint64(ek))
		}
	}
	for _, hs := range out {
		sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
	}
	return out
}
