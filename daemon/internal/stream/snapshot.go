package stream

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// Replay snapshots (docs/replay-snapshots.md): a replay request older than the publisher's buffer is answered with
// the stream's state as of its last batch L, built from the index's tree and token windows (index.KeepTokens, on
// for publishing streams unless --zmq-snapshots=false), one batch per dp_rank under seq L:
// [ts, [AllBlocksCleared, BlockStored...], rank]. The build runs in the asking client's reply goroutine; the drain
// goroutine waits only for the copy of the tree (snapGate).

// errNoSnapshot: the index has seen no event, so there is no seq to label a snapshot with (nothing to replay).
var errNoSnapshot = errors.New("the stream has no events yet")

// snapGate makes a snapshot's copy of the tree fall between two batches: the drain goroutine holds it across the
// apply of each BATCH record (a single EVENT record, a LOSS and a Cleared are applied under one index lock
// already), the copy holds it too. So the snapshot's last id L is a whole batch's: the batches after L are
// exactly what the state lacks.
type snapGate struct{ mu sync.Mutex }

// armReplay gives the stream's new publisher what its replies need beyond the buffer: the filler that keeps their
// seqs contiguous (Config.ReplayFill) and, when the daemon makes snapshots, its snapshot source (in layout w).
func (st *Stream) armReplay(p *zmqpub.Publisher, w vllmwire.Wire) {
	if p == nil {
		return
	}
	e := st.eng
	p.SetFiller(emptyBatch(st.rank.Load()), e.cfg.ReplayFill)
	if !e.KeepTokens(true) {
		return
	}
	st.mu.Lock()
	if st.ix != nil {
		st.ix.EnableTokens() // an index made for an ATTACH without publish (no drain goroutine runs here)
	}
	st.mu.Unlock()
	p.SetSnapshotter(st.snapshotter(w, e.cfg.SnapshotChunk), e.cfg.SnapshotLimit)
}

// snapshotter returns the stream's Snapshotter: the current index's tree, encoded in the stream's wire layout.
func (st *Stream) snapshotter(w vllmwire.Wire, chunk int) zmqpub.Snapshotter {
	return func() (zmqpub.Snapshot, error) {
		st.mu.Lock()
		ix, bs := st.ix, st.blockSize
		st.mu.Unlock()
		if ix == nil {
			return zmqpub.Snapshot{}, errNoSnapshot
		}
		st.snap.mu.Lock()
		ts, err := ix.Snapshot()
		st.snap.mu.Unlock()
		if err != nil {
			return zmqpub.Snapshot{}, err
		}
		if !ts.HasID {
			return zmqpub.Snapshot{}, errNoSnapshot
		}
		if bs == 0 {
			bs = ix.Config().BlockSize
		}
		b, fresh, err := snapshotBatches(ts, w, bs, st.rank.Load(), chunk)
		if err != nil {
			return zmqpub.Snapshot{}, err
		}
		return zmqpub.Snapshot{Seq: ts.ID, Batches: b, Fresh: fresh}, nil
	}
}

// snapshotBatches encodes a snapshot as one batch per dp_rank (ascending; fallback when the stream has carried
// none): [ts, [AllBlocksCleared, BlockStored (parents first)...], rank]. BlockStored events carry what live ones
// carry for an indexed block without metadata: medium "GPU", block_size the stream's, the LoRA name and Eagle form
// the blocks were stored with. chunk > 0 (--zmq-snapshot-chunk) splits a rank's batch once its events pass chunk
// bytes: the Cleared opens the first one, every later one continues the rank's events in order (parents still
// first). fresh is the same without the Cleareds, for a consumer that asked from seq 0 (zmqpub.Snapshot.Fresh): a
// rank's first batch without its Cleared, none for a rank that holds nothing; the other batches are shared.
func snapshotBatches(ts *index.TokenSnapshot, w vllmwire.Wire, bs, fallback uint32, chunk int) (out, fresh [][]byte,
	err error) {
	type rankBody struct {
		n    int    // events in body
		body []byte // the open batch's events
		// out and fresh: the rank's finished batches, with and without its Cleared
		out, fresh [][]byte
	}
	ts0 := batchTS(0)
	cleared := w.AppendEvent(nil, &vllmwire.Event{Kind: vllmwire.KindCleared})
	batch := func(r uint32, n int, parts ...[]byte) []byte {
		size := 32
		for _, p := range parts {
			size += len(p)
		}
		b := vllmwire.AppendBatchHeader(make([]byte, 0, size), ts0, n)
		for _, p := range parts {
			b = append(b, p...)
		}
		return vllmwire.AppendBatchTrailer(b, int64(r))
	}
	finish := func(r uint32, rb *rankBody) {
		if len(rb.out) == 0 { // the rank's first batch opens with its Cleared
			rb.out = append(rb.out, batch(r, rb.n+1, cleared, rb.body))
			if rb.n > 0 {
				rb.fresh = append(rb.fresh, batch(r, rb.n, rb.body))
			}
		} else {
			b := batch(r, rb.n, rb.body)
			rb.out, rb.fresh = append(rb.out, b), append(rb.fresh, b)
		}
		rb.body, rb.n = rb.body[:0], 0
	}
	ranks := slices.Clone(ts.DpRanks)
	if len(ranks) == 0 {
		ranks = []uint32{fallback}
	}
	bodies := make(map[uint32]*rankBody, len(ranks))
	for _, r := range ranks {
		bodies[r] = &rankBody{}
	}
	var ev vllmwire.Event
	err = ts.Events(func(e *index.SnapshotEvent) {
		rb := bodies[e.DpRank]
		if chunk > 0 && len(rb.body) >= chunk {
			finish(e.DpRank, rb)
		}
		ev = vllmwire.Event{Kind: vllmwire.KindStored, BlockHashes: e.BlockHashes, HasParent: e.HasParent,
			ParentHash: e.Parent, TokenIDs: e.TokenIDs, IsEagle: e.IsEagle, BlockSize: bs, HasMedium: true,
			Medium: "GPU", HasLoraName: e.LoraName != "", LoraName: e.LoraName}
		rb.body = w.AppendEvent(rb.body, &ev)
		rb.n++
	})
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	out = make([][]byte, 0, len(ranks))
	for _, r := range ranks {
		rb := bodies[r]
		finish(r, rb)
		out, fresh = append(out, rb.out...), append(fresh, rb.fresh...)
	}
	return out, fresh, nil
}
