package index

import (
	"io"
	"maps"
	"slices"
)

// CheckpointCopy is a consistent copy of what WriteCheckpoint encodes, taken under the read lock so that the
// encoding (and the file's write) can happen later on another goroutine while the writer keeps applying. The tree
// and token arena are copied (flat arrays, hash tables and the lookup maps); the event log is shared: its chunks
// are never modified below their fill mark (log.go), so the captured views stay valid.
type CheckpointCopy struct {
	ix    *Indexer // private: only the copy's WriteCheckpoint reads it
	n     int
	parts []logPart
}

// CheckpointCopy copies the index for a later CheckpointCopy.WriteCheckpoint.
func (ix *Indexer) CheckpointCopy() *CheckpointCopy {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	c := &Indexer{cfg: ix.cfg, tree: ix.tree.checkpointClone(), seenAny: ix.seenAny, lastSeen: ix.lastSeen,
		lost: slices.Clone(ix.lost), hasLost: ix.hasLost, maxLost: ix.maxLost, tainted: ix.tainted, taint: ix.taint,
		taintMore: ix.taintMore, taintLost: slices.Clone(ix.taintLost), treeVersion: ix.treeVersion, c: ix.c}
	c.dumpBuilds.Store(ix.dumpBuilds.Load())
	c.cacheHits.Store(ix.cacheHits.Load())
	c.cacheExtends.Store(ix.cacheExtends.Load())
	c.dumpErrors.Store(ix.dumpErrors.Load())
	n, parts := ix.log.checkpointParts()
	return &CheckpointCopy{ix: c, n: n, parts: parts}
}

// WriteCheckpoint writes the copy as Indexer.WriteCheckpoint would have written the index when it was copied.
func (c *CheckpointCopy) WriteCheckpoint(w io.Writer, meta []byte) error {
	if err := checkMeta(meta); err != nil {
		return err
	}
	return c.ix.encodeCheckpoint(w, meta, checkpointVersion, c.n, c.parts)
}

// checkpointClone copies what the checkpoint's tree and token sections read (tree.encode, tree.encodeTokens), and
// nothing else: the child table, slotOf and the live count are rebuilt from the nodes when a checkpoint is read,
// so copying them would only lengthen the drain worker's stall. The clone is for encoding only.
func (t *tree) checkpointClone() *tree {
	c := &tree{nodes: slices.Clone(t.nodes), flags: slices.Clone(t.flags), freeHead: t.freeHead,
		slots: make([]slotState, len(t.slots)), extra: make(map[uint32][]uint64, len(t.extra))}
	for i, s := range t.slots {
		c.slots[i] = slotState{dp: s.dp, lookup: maps.Clone(s.lookup)}
	}
	for n, ws := range t.extra {
		c.extra[n] = slices.Clone(ws)
	}
	if t.tok != nil {
		c.tok = &tokenStore{words: t.tok.words.clone(), lora: maps.Clone(t.tok.lora)}
	}
	return c
}
