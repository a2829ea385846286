package index

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"slices"
)

// Checkpoint format (CHECKPOINT.md has the byte diagram). Wire format: never change without bumping
// checkpointVersion.
const (
	checkpointMagic   = "KVSHMIX\x00"
	checkpointVersion = uint32(3)
	// checkpointV2 is still read: it has no tokens section (the restored index keeps no tokens).
	checkpointV2 = uint32(2)
	// checkpointV1 is the previous version, still read: it lacks token_mismatches and the losses since the last
	// Cleared (restored as the taint's first cause).
	checkpointV1 = uint32(1)
	// MaxCheckpointMeta bounds the caller's opaque metadata stored in a checkpoint.
	MaxCheckpointMeta = 4096
	maxReasonLen      = 1 << 16
	nodeBytes         = 8 + 8 + 8 + 4 + 4 + 4 // blockHash, tokensHash, workers, parent, firstChild, nextSib
	maxCkptBuffer     = 1 << 31               // largest max_buffer_size a checkpoint may carry
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// CheckpointError is returned by ReadCheckpoint for a checkpoint that is corrupt, truncated or of another format
// version: Offset is the byte offset where decoding failed (the trailer's offset for a checksum mismatch). It wraps
// ErrCheckpoint.
type CheckpointError struct {
	Offset int64
	Reason string
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("kvshm/index: corrupt checkpoint at byte %d: %s", e.Offset, e.Reason)
}

// Unwrap returns ErrCheckpoint.
func (e *CheckpointError) Unwrap() error { return ErrCheckpoint }

// WriteCheckpoint writes the index's complete state (configuration, tree, event log, id bookkeeping, taint and
// counters) with the caller's opaque meta (at most MaxCheckpointMeta bytes) to w. The dump cache is not saved: a
// restored index builds its next dump afresh. It holds the read lock while encoding, so concurrent readers go on but
// the writer waits; call it when ingest is stopped (the daemon does, after the final drain). The output is a
// deterministic function of the state.
func (ix *Indexer) WriteCheckpoint(w io.Writer, meta []byte) error {
	return ix.writeCheckpoint(w, meta, checkpointVersion)
}

// writeCheckpoint writes format version (checkpointVersion, or checkpointV1 for compatibility tests).
func (ix *Indexer) writeCheckpoint(w io.Writer, meta []byte, version uint32) error {
	if err := checkMeta(meta); err != nil {
		return err
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	n, parts := ix.log.checkpointParts()
	return ix.encodeCheckpoint(w, meta, version, n, parts)
}

// encodeCheckpoint writes ix with the log section's events (n in parts): under the read lock, or on a
// CheckpointCopy's private index.
func (ix *Indexer) encodeCheckpoint(w io.Writer, meta []byte, version uint32, n int, parts []logPart) error {
	e := &ckEnc{w: w, buf: make([]byte, 0, ckChunk+64)}
	e.bytes([]byte(checkpointMagic))
	e.u32(version)
	e.u32(uint32(len(meta)))
	e.bytes(meta)
	ix.encodeConfig(e)
	ix.encodeIDs(e, version)
	ix.tree.encode(e, version)
	encodeLog(e, n, parts)
	if version >= checkpointVersion {
		ix.tree.encodeTokens(e)
	}
	return e.finish()
}

func checkMeta(meta []byte) error {
	if len(meta) > MaxCheckpointMeta {
		return fmt.Errorf("write checkpoint: meta of %d bytes exceeds %d", len(meta), MaxCheckpointMeta)
	}
	return nil
}

// encodeConfig writes the config section (CHECKPOINT.md).
func (ix *Indexer) encodeConfig(e *ckEnc) {
	e.u64(ix.cfg.WorkerID)
	e.u32(ix.cfg.BlockSize)
	e.u64(uint64(ix.cfg.MaxBufferSize))
}

// encodeIDs writes the ids section: id bookkeeping, taint, counters, lost ranges.
func (ix *Indexer) encodeIDs(e *ckEnc, version uint32) {
	var flags uint8
	if ix.seenAny {
		flags |= 1
	}
	if ix.tainted {
		flags |= 2
	}
	e.u8(flags)
	e.u64(ix.lastSeen)
	e.lostRange(ix.taint)
	e.u64(uint64(ix.taintMore))
	e.u64(ix.treeVersion)
	for _, v := range []uint64{ix.c.lostIDs, ix.c.gaps, ix.c.losses, ix.c.unknowns, ix.c.idResets, ix.c.rejected,
		ix.dumpBuilds.Load(), ix.cacheHits.Load(), ix.cacheExtends.Load(), ix.dumpErrors.Load()} {
		e.u64(v)
	}
	for k := range ix.c.applied {
		for j := range ix.c.applied[k] {
			e.u64(ix.c.applied[k][j])
		}
	}
	e.u32(uint32(len(ix.lost)))
	for _, r := range ix.lost {
		e.lostRange(r)
	}
	if version != checkpointV1 {
		e.u64(ix.c.tokenMismatches)
		e.u32(uint32(len(ix.taintLost)))
		for _, r := range ix.taintLost {
			e.lostRange(r)
		}
	}
}

// encode writes the tree section: slots, node arena, spilled worker bits, lookups (sorted: the output is
// deterministic).
func (t *tree) encode(e *ckEnc, version uint32) {
	e.u32(uint32(len(t.slots)))
	for _, s := range t.slots {
		e.u32(s.dp)
	}
	e.u32(uint32(len(t.nodes)))
	e.u32(t.freeHead)
	for i := range t.nodes {
		nd := &t.nodes[i]
		e.u64(nd.blockHash)
		e.u64(nd.tokensHash)
		e.u64(nd.workers)
		e.u32(nd.parent)
		e.u32(nd.firstChild)
		e.u32(nd.nextSib)
	}
	if version != checkpointV1 {
		e.bytes(t.flags)
	}
	keys := make([]uint32, 0, len(t.extra))
	for n := range t.extra {
		keys = append(keys, n)
	}
	slices.Sort(keys)
	e.u32(uint32(len(keys)))
	for _, n := range keys {
		ws := t.extra[n]
		e.u32(n)
		e.u32(uint32(len(ws)))
		for _, x := range ws {
			e.u64(x)
		}
	}
	var hs []uint64
	for _, s := range t.slots {
		hs = hs[:0]
		for h := range s.lookup {
			hs = append(hs, h)
		}
		slices.Sort(hs)
		e.u32(uint32(len(hs)))
		for _, h := range hs {
			e.u64(h)
			e.u32(s.lookup[h])
		}
	}
}

// checkpointParts captures the events the log section holds (n of them) for encoding outside the lock (view).
func (l *eventLog) checkpointParts() (int, []logPart) {
	// A cut front batch (eventLog.frontCut) is not saved: the restored log starts at the next batch, and a query
	// from the cut id is answered with a dump, as before the restore.
	start := 0
	if l.frontCut {
		for start < l.count && l.hdr(start).id == l.firstID() {
			start++
		}
	}
	return l.count - start, l.view(start, nil)
}

// encodeLog writes the log section: the n events of parts, oldest first.
func encodeLog(e *ckEnc, n int, parts []logPart) {
	e.u32(uint32(n))
	for _, p := range parts {
		for k := range p.hdrs {
			h := &p.hdrs[k]
			e.u64(h.id)
			e.u32(h.dp)
			e.u8(uint8(h.kind))
			e.bool(h.hasParent)
			e.u64(h.parent)
			e.u32(h.n)
			nw := h.n
			if h.kind == KindStored {
				nw = 2 * h.n
			}
			for _, x := range p.words[h.off : h.off+nw] {
				e.u64(x)
			}
		}
	}
}

// ckChunk is the size of the encoder's buffer: it is checksummed and written whenever it fills.
const ckChunk = 256 << 10

// ckEnc appends little-endian values to a buffer that it checksums and writes in chunks; the first write error
// sticks.
type ckEnc struct {
	w   io.Writer
	buf []byte
	crc uint32
	err error
}

func (e *ckEnc) flush() {
	e.crc = crc32.Update(e.crc, crcTable, e.buf)
	if e.err == nil {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

func (e *ckEnc) bytes(p []byte) {
	for len(p) > 0 {
		n := min(len(p), ckChunk-len(e.buf))
		e.buf = append(e.buf, p[:n]...)
		p = p[n:]
		if len(e.buf) >= ckChunk {
			e.flush()
		}
	}
}

// The fixed-size appenders may overrun ckChunk by a few bytes (the buffer has room); they flush after.
func (e *ckEnc) u8(v uint8) {
	e.buf = append(e.buf, v)
	if len(e.buf) >= ckChunk {
		e.flush()
	}
}

func (e *ckEnc) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *ckEnc) u32(v uint32) {
	e.buf = binary.LittleEndian.AppendUint32(e.buf, v)
	if len(e.buf) >= ckChunk {
		e.flush()
	}
}

func (e *ckEnc) u64(v uint64) {
	e.buf = binary.LittleEndian.AppendUint64(e.buf, v)
	if len(e.buf) >= ckChunk {
		e.flush()
	}
}

func (e *ckEnc) str(s string) {
	if len(s) > maxReasonLen {
		s = s[:maxReasonLen]
	}
	e.u32(uint32(len(s)))
	e.bytes([]byte(s))
}

func (e *ckEnc) lostRange(r LostRange) {
	e.u64(r.First)
	e.u64(r.Last)
	e.bool(r.Unknown)
	e.str(r.Reason)
}

func (e *ckEnc) finish() error {
	e.flush()
	if e.err == nil {
		_, e.err = e.w.Write(binary.LittleEndian.AppendUint32(nil, e.crc))
	}
	if e.err != nil {
		return fmt.Errorf("write checkpoint: %w", e.err)
	}
	return nil
}

// ReadCheckpoint reads a checkpoint written by WriteCheckpoint and returns the restored index and the meta it was
// written with. Every count, index and reference is validated (the tree must be a forest whose nodes are each
// reachable exactly once, lookups must point at live nodes, log ids must not decrease, the checksum must match, no
// byte may follow); any violation is a *CheckpointError wrapping ErrCheckpoint. Errors reading r are returned
// wrapped as they are. It never panics on any input. The whole checkpoint is read into memory first (sized once
// when r is an *os.File or has a Len method, as *bytes.Reader does), and never more than that size, or than
// MaxCheckpointBytes when the size is unknown: a reader that never ends (a device, a pipe) is a *CheckpointError, not
// an unbounded read.
func ReadCheckpoint(r io.Reader) (*Indexer, []byte, error) {
	limit := int64(MaxCheckpointBytes)
	switch v := r.(type) {
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := v.Stat(); err == nil && fi.Mode().IsRegular() {
			limit = min(fi.Size(), limit)
		}
	case interface{ Len() int }:
		limit = min(int64(v.Len()), limit)
	}
	buf := bytes.NewBuffer(make([]byte, 0, min(limit, 1<<30)+bytes.MinRead))
	n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoint: %w", err)
	}
	if n > limit {
		return nil, nil, &CheckpointError{Offset: limit, Reason: fmt.Sprintf("more than %d bytes (its size, or MaxCheckpointBytes)", limit)}
	}
	return decodeCheckpoint(buf.Bytes())
}

// MaxCheckpointBytes bounds what ReadCheckpoint reads from a reader of unknown size: 64 GiB, a billion resident
// blocks at ~53 B each, far beyond any index.
const MaxCheckpointBytes = 1 << 36

// ckDec decodes little-endian values from a byte slice; the first error sticks and later reads return zeros.
type ckDec struct {
	b       []byte
	off     int
	err     *CheckpointError
	version uint32
}

func (d *ckDec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = &CheckpointError{Offset: int64(d.off), Reason: fmt.Sprintf(format, args...)}
	}
}

func (d *ckDec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("truncated: %d bytes needed, %d left", n, len(d.b)-d.off)
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *ckDec) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *ckDec) bool() bool {
	v := d.u8()
	if v > 1 {
		d.off--
		d.fail("boolean byte %d", v)
	}
	return v == 1
}

func (d *ckDec) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *ckDec) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// count reads a u32 count of items of at least size bytes each and checks that they can fit in what is left, so a
// corrupt count cannot make the decoder allocate more than the input's size.
func (d *ckDec) count(size int, what string) int {
	n := d.u32()
	if left := len(d.b) - d.off; d.err == nil && uint64(n)*uint64(size) > uint64(left) {
		d.off -= 4
		d.fail("%s count %d exceeds the remaining %d bytes", what, n, left)
		return 0
	}
	return int(n)
}

func (d *ckDec) str() string {
	n := d.u32()
	if n > maxReasonLen {
		d.off -= 4
		d.fail("string of %d bytes", n)
		return ""
	}
	return string(d.take(int(n)))
}

func (d *ckDec) lostRange() LostRange {
	return LostRange{First: d.u64(), Last: d.u64(), Unknown: d.bool(), Reason: d.str()}
}

func decodeCheckpoint(b []byte) (*Indexer, []byte, error) {
	d := &ckDec{b: b}
	ix, meta := d.decode()
	if d.err != nil {
		return nil, nil, fmt.Errorf("read checkpoint: %w", d.err)
	}
	return ix, meta, nil
}

func (d *ckDec) decode() (*Indexer, []byte) {
	const trailer = 4
	if len(d.b) < len(checkpointMagic)+8+trailer || string(d.b[:len(checkpointMagic)]) != checkpointMagic {
		d.fail("not a kvshm index checkpoint (bad magic or too short: %d bytes)", len(d.b))
		return nil, nil
	}
	d.off = len(checkpointMagic)
	version := d.u32()
	d.version = version
	if version != checkpointVersion && version != checkpointV2 && version != checkpointV1 {
		d.off -= 4
		d.fail("unsupported format version %d (this build reads %d to %d)", version, checkpointV1, checkpointVersion)
		return nil, nil
	}
	body := len(d.b) - trailer
	if want, got := binary.LittleEndian.Uint32(d.b[body:]), crc32.Checksum(d.b[:body], crcTable); want != got {
		d.off = body
		d.fail("checksum mismatch: stored %08x, computed %08x", want, got)
		return nil, nil
	}
	d.b = d.b[:body] // the decoder must consume the body exactly

	mlen := d.u32()
	if mlen > MaxCheckpointMeta {
		d.fail("meta of %d bytes", mlen)
		return nil, nil
	}
	meta := slices.Clone(d.take(int(mlen)))

	ix := d.decodeConfig()
	if ix == nil || !d.decodeIDs(ix, version) {
		return nil, nil
	}
	if !d.decodeTree(ix.tree) {
		return nil, nil
	}
	if !d.decodeLog(ix) {
		return nil, nil
	}
	if version >= checkpointVersion && !d.decodeTokens(ix) {
		return nil, nil
	}
	if d.off != len(d.b) {
		d.fail("%d bytes of trailing data", len(d.b)-d.off)
		return nil, nil
	}
	return ix, meta
}

// decodeConfig reads the config section and returns an empty index of that configuration (nil on error).
func (d *ckDec) decodeConfig() *Indexer {
	cfg := Config{WorkerID: d.u64(), BlockSize: d.u32()}
	mb := d.u64()
	if d.err == nil && (cfg.BlockSize == 0 || mb > maxCkptBuffer) {
		d.fail("invalid config: block size %d, max buffer size %d", cfg.BlockSize, mb)
	}
	cfg.MaxBufferSize = int(mb)
	if d.err != nil {
		return nil
	}
	ix, err := New(cfg)
	if err != nil {
		d.fail("invalid config: %v", err)
		return nil
	}
	return ix
}

// decodeIDs reads the ids section (id bookkeeping, taint, counters, lost ranges) into ix.
func (d *ckDec) decodeIDs(ix *Indexer, version uint32) bool {
	flags := d.u8()
	if flags&^3 != 0 {
		d.fail("unknown flags %#x", flags)
	}
	ix.seenAny, ix.tainted = flags&1 != 0, flags&2 != 0
	ix.lastSeen = d.u64()
	ix.taint = d.lostRange()
	tm := d.u64()
	if tm > math.MaxInt32 {
		d.fail("taint count %d", tm)
	}
	ix.taintMore = int(tm)
	ix.treeVersion = d.u64()
	for _, p := range []*uint64{&ix.c.lostIDs, &ix.c.gaps, &ix.c.losses, &ix.c.unknowns, &ix.c.idResets, &ix.c.rejected} {
		*p = d.u64()
	}
	ix.dumpBuilds.Store(d.u64())
	ix.cacheHits.Store(d.u64())
	ix.cacheExtends.Store(d.u64())
	ix.dumpErrors.Store(d.u64())
	for k := range ix.c.applied {
		for j := range ix.c.applied[k] {
			ix.c.applied[k][j] = d.u64()
		}
	}
	nl := d.count(21, "lost range")
	if nl > MaxLostRanges {
		d.fail("%d lost ranges (at most %d)", nl, MaxLostRanges)
		return false
	}
	for range nl {
		r := d.lostRange()
		if r.Last < r.First && !(r.Unknown && r.First == r.Last+1) {
			d.fail("lost range %d..%d", r.First, r.Last)
		}
		ix.lost = append(ix.lost, r)
		if !ix.hasLost || r.Last > ix.maxLost {
			ix.maxLost = r.Last
		}
		ix.hasLost = true
	}
	if version == checkpointV1 {
		if ix.tainted {
			ix.taintLost = append(ix.taintLost, ix.taint)
		}
	} else {
		ix.c.tokenMismatches = d.u64()
		nt := d.count(21, "taint range")
		if nt > MaxLostRanges || (nt > 0) != ix.tainted {
			d.fail("%d losses since the last Cleared (at most %d, and some exactly when tainted: %v)", nt,
				MaxLostRanges, ix.tainted)
			return false
		}
		for range nt {
			ix.taintLost = append(ix.taintLost, d.lostRange())
		}
	}
	return d.err == nil
}

// decodeTree reads the tree section into t (the slots, the node arena, the spilled worker bits and the lookups, in
// the order of CHECKPOINT.md), and validates the structure the tree code relies on: a forest (the root plus
// detached nodes referenced by lookups) in which every live node is reached exactly once through its parent's child
// list, a free list covering every other node, unique (parent, tokens hash) edges, worker bits only for existing
// slots, lookups pointing at live nodes.
func (d *ckDec) decodeTree(t *tree) bool {
	td := &treeDec{d: d, t: t}
	return td.slots() && td.arena() && td.freeList() && td.forest() && td.extra() && td.lookups()
}

// treeDec is the state decodeTree's steps share.
type treeDec struct {
	d       *ckDec
	t       *tree
	ns, nn  int     // slots, nodes
	nodesAt int     // offset of the node arena (for errors naming a node)
	state   []uint8 // per node: 0 unseen, 1 free, 2 live (reached)
}

// bad fails at node i's offset.
func (td *treeDec) bad(i int, format string, args ...any) bool {
	td.d.off = td.nodesAt + i*nodeBytes
	td.d.fail("node %d: "+format, append([]any{i}, args...)...)
	return false
}

// slots reads n_slots and the dp_ranks (distinct).
func (td *treeDec) slots() bool {
	d, t := td.d, td.t
	td.ns = d.count(4, "slot")
	for range td.ns {
		dp := d.u32()
		if _, dup := t.slotOf[dp]; dup && d.err == nil {
			d.fail("dp_rank %d appears twice", dp)
		}
		t.slot(dp)
	}
	return true // a failure sticks in d.err, checked by arena
}

// arena reads n_nodes, free_head and the nodes, and checks every link is inside the arena and every worker bit
// names an existing slot.
func (td *treeDec) arena() bool {
	d, t := td.d, td.t
	nn := d.count(nodeBytes, "node")
	t.freeHead = d.u32()
	if d.err != nil {
		return false
	}
	if nn < 1 || uint32(nn) == nilNode {
		d.fail("node count %d", nn)
		return false
	}
	td.nn, td.nodesAt = nn, d.off
	t.nodes = make([]node, nn)
	for i := range t.nodes {
		p := d.take(nodeBytes)
		if p == nil { // the count was checked before free_head was read: the last node may still be cut
			return false
		}
		t.nodes[i] = node{
			blockHash: binary.LittleEndian.Uint64(p), tokensHash: binary.LittleEndian.Uint64(p[8:]),
			workers: binary.LittleEndian.Uint64(p[16:]), parent: binary.LittleEndian.Uint32(p[24:]),
			firstChild: binary.LittleEndian.Uint32(p[28:]), nextSib: binary.LittleEndian.Uint32(p[32:]),
		}
	}
	flagsAt := d.off
	if d.version == checkpointV1 {
		// Version 1 had no edge flags: every block is an edge of its own (the dump then groups blocks by worker
		// sets alone).
		t.flags = make([]uint8, nn)
		for i := 1; i < nn; i++ {
			t.flags[i] = flagEdge
		}
	} else {
		f := d.take(nn)
		if f == nil {
			return false
		}
		t.flags = slices.Clone(f)
		for i, v := range t.flags {
			if v&^(flagEdge|flagInternal) != 0 || (i == 0 && v != 0) {
				d.off = flagsAt + i
				d.fail("node %d: unknown edge flags %#x", i, v)
				return false
			}
		}
	}
	ref := func(x uint32) bool { return x == nilNode || int(x) < nn }
	for i := range t.nodes {
		nd := &t.nodes[i]
		if !ref(nd.parent) || !ref(nd.firstChild) || !ref(nd.nextSib) {
			return td.bad(i, "link out of the arena (parent %d, child %d, sibling %d)", nd.parent, nd.firstChild, nd.nextSib)
		}
		if td.ns < 64 && nd.workers>>uint(td.ns) != 0 {
			return td.bad(i, "worker bits %#x beyond the %d dp_rank slots", nd.workers, td.ns)
		}
	}
	return true
}

// freeList follows free_head: each free node once, never the root, unlinked and without workers; then checks the
// root.
func (td *treeDec) freeList() bool {
	t, nn := td.t, td.nn
	td.state = make([]uint8, nn)
	state := td.state
	for x, steps := t.freeHead, 0; x != nilNode; x, steps = t.nodes[x].firstChild, steps+1 {
		if x == rootNode || int(x) >= nn || state[x] != 0 {
			return td.bad(int(min(x, uint32(nn-1))), "free list revisits or names the root or leaves the arena (%d)", x)
		}
		nd := &t.nodes[x]
		if nd.parent != nilNode || nd.nextSib != nilNode || nd.workers != 0 {
			return td.bad(int(x), "free node is linked or has workers")
		}
		state[x] = 1
	}
	root := &t.nodes[rootNode]
	if state[rootNode] != 0 || root.parent != nilNode || root.nextSib != nilNode || root.workers != 0 {
		return td.bad(0, "invalid root")
	}
	return true
}

// forest walks down from the root and every detached node: every live node is reached exactly once from its own
// parent, no two children of a node share a tokens hash. It builds the child table and the live count.
func (td *treeDec) forest() bool {
	t, nn, state := td.t, td.nn, td.state
	// Size the child table once for every node (it would grow to about this while the tree was built).
	size := 16
	for size*3 < nn*4 {
		size *= 2
	}
	t.children.slots = make([]uint32, size)
	for i := range t.children.slots {
		t.children.slots[i] = nilNode
	}
	stack := make([]uint32, 0, 64)
	live := 0
	for i := range t.nodes {
		if state[i] != 0 || t.nodes[i].parent != nilNode {
			continue
		}
		if t.nodes[i].nextSib != nilNode {
			return td.bad(i, "detached node has a sibling")
		}
		state[i] = 2
		live++
		stack = append(stack[:0], uint32(i))
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for c := t.nodes[p].firstChild; c != nilNode; c = t.nodes[c].nextSib {
				if state[c] != 0 || t.nodes[c].parent != p {
					return td.bad(int(c), "child of %d reached twice, free, or naming parent %d", p, t.nodes[c].parent)
				}
				if _, dup := t.child(p, t.nodes[c].tokensHash); dup {
					return td.bad(int(c), "second child of %d under tokens hash %d", p, t.nodes[c].tokensHash)
				}
				t.childInsert(c)
				state[c] = 2
				live++
				stack = append(stack, c)
			}
		}
	}
	for i := range state {
		if state[i] == 0 {
			return td.bad(i, "not on the free list and not reachable through its parent %d", t.nodes[i].parent)
		}
	}
	t.live = live - 1
	return true
}

// extra reads the worker bits of slots >= 64: live nodes in ascending order, a nonzero word, no bits beyond the
// slots.
func (td *treeDec) extra() bool {
	d, t, nn, ns := td.d, td.t, td.nn, td.ns
	ne := d.count(8, "extra worker set")
	prev := int64(-1)
	for range ne {
		n, nw := d.u32(), d.count(8, "extra worker word")
		ws := make([]uint64, nw)
		nonzero := false
		for j := range ws {
			ws[j] = d.u64()
			nonzero = nonzero || ws[j] != 0
		}
		if d.err != nil {
			return false
		}
		switch {
		case int64(n) <= prev || int(n) >= nn || n == rootNode || td.state[n] != 2:
			d.fail("extra worker set of node %d (not increasing, or not a live node)", n)
		case !nonzero || ns <= 64 || nw > (ns-1)/64:
			d.fail("extra worker set of node %d: %d words for %d slots, all zero %v", n, nw, ns, !nonzero)
		case (ns%64 != 0 && nw == (ns-1)/64 && ws[nw-1]>>uint(ns%64) != 0):
			d.fail("extra worker set of node %d has bits beyond the %d slots", n, ns)
		}
		if d.err != nil {
			return false
		}
		if t.extra == nil {
			t.extra = make(map[uint32][]uint64)
		}
		t.extra[n] = ws
		prev = int64(n)
	}
	return true
}

// lookups reads each slot's lookup (ascending hashes, pointing at live non-root nodes), counts the node
// references, and checks that every detached node is referenced.
func (td *treeDec) lookups() bool {
	d, t, nn := td.d, td.t, td.nn
	for s := range t.slots {
		nk := d.count(12, "lookup entry")
		lk := make(map[uint64]uint32, nk)
		var last uint64
		for k := range nk {
			h, x := d.u64(), d.u32()
			if d.err != nil {
				return false
			}
			if (k > 0 && h <= last) || x == rootNode || int(x) >= nn || td.state[x] != 2 {
				d.fail("lookup of dp_rank %d: hash %d -> node %d (not increasing, or not a live node)", t.slots[s].dp, h, x)
				return false
			}
			lk[h] = x
			t.nodes[x].refs++
			last = h
		}
		t.slots[s].lookup = lk
	}
	for i := 1; i < nn; i++ {
		if td.state[i] == 2 && t.nodes[i].parent == nilNode && t.nodes[i].refs == 0 {
			return td.bad(i, "detached node without lookup references")
		}
	}
	return d.err == nil
}

// decodeLog reads the event log (non-decreasing ids: equal inside a batch; at most max_buffer_size events) into ix.log.
func (d *ckDec) decodeLog(ix *Indexer) bool {
	n := d.count(26, "log event")
	if n > ix.log.max {
		d.fail("%d logged events exceed max_buffer_size %d", n, ix.log.max)
		return false
	}
	var blocks []Block
	var hashes []uint64
	var last uint64
	for i := range n {
		at := d.off
		id, dp, kind, hasParent, parent := d.u64(), d.u32(), Kind(d.u8()), d.bool(), d.u64()
		cnt := d.u32()
		words := uint64(cnt)
		if kind == KindStored {
			words *= 2
		}
		if d.err == nil && words*8 > uint64(len(d.b)-d.off) {
			d.fail("event %d: %d words exceed the remaining bytes", id, words)
		}
		if d.err != nil {
			return false
		}
		blocks, hashes = blocks[:0], hashes[:0]
		switch kind {
		case KindStored:
			for range cnt {
				blocks = append(blocks, Block{BlockHash: d.u64(), TokensHash: d.u64()})
			}
		case KindRemoved:
			for range cnt {
				hashes = append(hashes, d.u64())
			}
		case KindCleared:
			if cnt != 0 {
				d.off = at
				d.fail("cleared event %d carries %d hashes", id, cnt)
			}
		default:
			d.off = at
			d.fail("event %d: kind %d", id, kind)
		}
		if d.err == nil && i > 0 && id < last {
			d.off = at
			d.fail("event id %d does not follow %d", id, last)
		}
		if d.err != nil {
			return false
		}
		ix.log.append(id, dp, kind, hasParent, parent, blocks, hashes)
		last = id
	}
	if n > 0 && (!ix.seenAny || ix.lastSeen < last) {
		d.fail("last seen id %d (seen %v) is behind the logged id %d", ix.lastSeen, ix.seenAny, last)
		return false
	}
	return true
}

// encodeTokens writes the tokens section (version 3): keep u8; when 1, the known windows (nodes ascending) and the
// LoRA names (nodes ascending).
func (t *tree) encodeTokens(e *ckEnc) {
	e.bool(t.tok != nil)
	if t.tok == nil {
		return
	}
	ts := t.tok
	var known []uint32
	for n := range t.nodes {
		if ts.window(uint32(n)) != nil {
			known = append(known, uint32(n))
		}
	}
	e.u32(uint32(len(known)))
	for _, n := range known {
		w := ts.window(n)
		e.u32(n)
		e.u32(uint32(len(w)))
		for _, x := range w {
			e.u32(x)
		}
	}
	keys := make([]uint32, 0, len(ts.lora))
	for n := range ts.lora {
		keys = append(keys, n)
	}
	slices.Sort(keys)
	e.u32(uint32(len(keys)))
	for _, n := range keys {
		e.u32(n)
		e.str(ts.lora[n])
	}
}

// decodeTokens reads the tokens section: windows of block_size or block_size+1 tokens of live non-root nodes,
// nodes strictly ascending; LoRA names, non-empty, of nodes with a window, ascending.
func (d *ckDec) decodeTokens(ix *Indexer) bool {
	if !d.bool() {
		return d.err == nil
	}
	t := ix.tree
	ts := newTokenStore(ix.cfg.BlockSize)
	t.tok, ix.cfg.KeepTokens = ts, true
	bs := int(ix.cfg.BlockSize)
	n := d.count(8+4*bs, "token window")
	free := map[uint32]bool{} // the free list was validated (decodeTree): a chain of distinct nodes
	if n > 0 {
		for x := t.freeHead; x != nilNode; x = t.nodes[x].firstChild {
			free[x] = true
		}
	}
	prev := int64(-1)
	for range n {
		node, cnt := d.u32(), int(d.u32())
		if d.err != nil {
			return false
		}
		if int64(node) <= prev || node == rootNode || int(node) >= len(t.nodes) || free[node] {
			d.fail("token window of node %d: not a live node after %d", node, prev)
			return false
		}
		if cnt != bs && cnt != bs+1 {
			d.fail("token window of node %d: %d tokens, want %d or %d", node, cnt, bs, bs+1)
			return false
		}
		prev = int64(node)
		w := ts.words.slot(node)
		w[0] = uint32(cnt)
		for j := range cnt {
			w[1+j] = d.u32()
		}
	}
	n = d.count(8, "LoRA name")
	prev = -1
	for range n {
		node := d.u32()
		name := d.str()
		if d.err != nil {
			return false
		}
		if int64(node) <= prev || int(node) >= len(t.nodes) || ts.window(node) == nil || name == "" {
			d.fail("LoRA name of node %d: not a node with tokens after %d, or empty", node, prev)
			return false
		}
		prev = int64(node)
		if ts.lora == nil {
			ts.lora = make(map[uint32]string)
		}
		ts.lora[node] = name
	}
	return d.err == nil
}
