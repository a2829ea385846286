package stream

// rankSet is the set of dp_ranks an ALL stream's drain goroutine has seen (to open --rank-ports listeners on the
// first event of each rank). Owned by the drain goroutine; on is false when rank ports are off (nothing is kept).
type rankSet struct {
	on   bool
	low  uint64              // ranks 0..63
	high map[uint32]struct{} // the others
}

func (r *rankSet) has(rank uint32) bool {
	if rank < 64 {
		return r.low&(1<<rank) != 0
	}
	_, ok := r.high[rank]
	return ok
}

func (r *rankSet) add(rank uint32) {
	if rank < 64 {
		r.low |= 1 << rank
		return
	}
	if r.high == nil {
		r.high = map[uint32]struct{}{}
	}
	r.high[rank] = struct{}{}
}
