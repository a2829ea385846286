package stream

import "fmt"

// Key identifies a stream: a worker and the scope of its producer. Scope ALL (PerRank false: no dp_rank in the
// ATTACH, one producer for every attention-DP rank, as TensorRT-LLM does) or one dp_rank (PerRank true: one
// producer per rank with its own seq space, as vLLM does). At most one live producer feeds a key.
type Key struct {
	Worker  uint64
	Rank    uint32 // valid when PerRank
	PerRank bool
}

// KeyOf is the key of an ATTACH's worker and optional dp_rank (absent: scope ALL).
func KeyOf(worker uint64, dpRank *uint32) Key {
	if dpRank == nil {
		return Key{Worker: worker}
	}
	return Key{Worker: worker, Rank: *dpRank, PerRank: true}
}

// String is the key as logs and messages show it: "worker 7" or "worker 7 dp_rank 1".
func (k Key) String() string {
	if !k.PerRank {
		return fmt.Sprintf("worker %d", k.Worker)
	}
	return fmt.Sprintf("worker %d dp_rank %d", k.Worker, k.Rank)
}

// LogAttrs are the key's slog attributes.
func (k Key) LogAttrs() []any {
	if !k.PerRank {
		return []any{"worker_id", k.Worker}
	}
	return []any{"worker_id", k.Worker, "dp_rank", k.Rank}
}
