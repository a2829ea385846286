package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// Writer is the producer side of a ring. It is owned by one goroutine: no method may run concurrently with
// another. It never blocks: a record that does not fit is refused at once.
type Writer struct {
	f    *os.File // holds the producer flock; nil after Close
	m    []byte   // the whole mapping; nil after Close
	data []byte   // m[HeaderSize:], the data area
	path string

	capacity  uint64
	mask      uint64
	maxRecord uint64

	tail      uint64 // staged position: end of the last appended record. Owned by the writer.
	published uint64 // last tail stored into the header. Owned by the writer.
	headCache uint64 // last head loaded from the header; re-read only when it says the ring is full.

	// Loss accounting, mirrored into the header (the writer never reads it back from the mapping).
	droppedEvents uint64
	droppedBytes  uint64
	lossPending   bool
	lossFirst     uint64
	lossLast      uint64
	lossCount     uint64 // events dropped since the last LOSS record

	lossBuf  [LossPayloadSize]byte
	batchBuf []byte // WriteBatch's staging buffer, reused
}

// Create makes a new ring file at path and returns its producer. The file is created exclusively with mode
// o.Mode (0600 by default), locked with flock(LOCK_EX|LOCK_NB) for the Writer's lifetime, preallocated in full
// (ErrNoSpace when the file system is full), and its header is complete before the state becomes READY.
// A path that exists is refused: ErrLocked when a producer holds it, ErrExist when it is a stale file.
func Create(path string, o Options) (*Writer, error) {
	id, err := selfIdentity()
	if err != nil {
		return nil, fmt.Errorf("create ring %s: %w", path, err)
	}
	return create(path, o, id)
}

func create(path string, o Options, id identity) (*Writer, error) {
	if !nativeLittleEndian {
		return nil, ErrPlatform
	}
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("create ring %s: %w", path, err)
	}
	size := int64(HeaderSize) + int64(o.Capacity)
	f, err := createFile(path, size, o.Mode)
	if err != nil {
		return nil, fmt.Errorf("create ring %s: %w", path, err)
	}
	m, err := mapFile(f, size)
	if err == nil {
		err = checkAtomicAlignment(m)
		if err != nil {
			unmap(m)
		}
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("create ring %s: %w", path, err)
	}
	h := Header{
		Version: Version, HeaderSize: HeaderSize, Capacity: o.Capacity, MaxRecord: o.MaxRecord,
		ProducerPID: id.pid, ProducerStartTime: id.startTime, Epoch: id.epoch,
		WorkerID: o.WorkerID, KVBlockSize: o.KVBlockSize, MaxBufferSize: o.MaxBufferSize,
	}
	copy(h.Magic[:], Magic)
	// The file is fresh (fallocate zero-fills), so tail, head and the counters are already 0 and state is INIT.
	putHeader(m, &h)
	storeState(m, StateReady) // release: publishes the header written above
	return &Writer{
		f: f, m: m, data: m[HeaderSize:], path: path,
		capacity: o.Capacity, mask: o.Capacity - 1, maxRecord: uint64(o.MaxRecord),
	}, nil
}

// Path returns the ring file's path.
func (w *Writer) Path() string { return w.path }

// Append stages one record without publishing it (Publish makes staged records visible with one tail store). It
// returns false, writing nothing visible, when the record does not fit in the free space (including a padding
// record at the wrap), exceeds max_record, or typ is not TypeEvent, TypeLoss or TypeBatch, or the Writer is closed. Append
// does not count drops; WriteEvent does.
func (w *Writer) Append(typ uint32, payload []byte) bool {
	if w.m == nil || (typ != TypeEvent && typ != TypeLoss && typ != TypeBatch) {
		return false
	}
	length := uint64(RecordHeaderSize) + uint64(len(payload))
	if length > w.maxRecord {
		return false
	}
	idx, ok := w.reserve(length)
	if !ok {
		return false
	}
	// Payload, then header. Nothing here is visible until Publish stores the tail, so the order is only the
	// documented convention.
	copy(w.data[idx+RecordHeaderSize:idx+length], payload)
	binary.LittleEndian.PutUint32(w.data[idx:], uint32(length))
	binary.LittleEndian.PutUint32(w.data[idx+4:], typ)
	w.tail += align8(length)
	return true
}

// reserve finds room for a record of length bytes at the staged tail, writing a padding record first if the
// record would cross the end of the data area. It returns the record's index in the data area.
func (w *Writer) reserve(length uint64) (uint64, bool) {
	size := align8(length)
	idx := w.tail & w.mask
	var pad uint64
	if size > w.capacity-idx {
		pad = w.capacity - idx // the record restarts at index 0; the pad is part of the free-space check
	}
	need := size + pad
	if w.tail+need-w.headCache > w.capacity {
		h := loadHead(w.m) // acquire; see loadHead
		if h > w.published && h%RecordAlign == 0 && h-w.published <= w.capacity && w.tail == w.published {
			// The consumer skipped to a corrupt tail word that lay ahead of ours: it abandoned every position
			// before h, so write from h on. This record is dropped (counted, reported by the next LOSS record)
			// rather than written into the same reservation, which keeps the repair to one rule.
			w.tail, w.published, w.headCache = h, h, h
			return 0, false
		}
		if h > w.published || h%RecordAlign != 0 || h < w.headCache {
			// A head no correct consumer can store: keep the producer safe by treating the ring as full.
			return 0, false
		}
		w.headCache = h
		if w.tail+need-h > w.capacity {
			return 0, false
		}
	}
	if pad != 0 {
		binary.LittleEndian.PutUint32(w.data[idx:], uint32(pad))
		binary.LittleEndian.PutUint32(w.data[idx+4:], TypePadding)
		w.tail += pad
		idx = 0
	}
	return idx, true
}

// Publish makes every staged record visible to the consumer with one tail store, then rings the doorbell if the
// consumer is parked (one FUTEX_WAKE system call; none while the consumer polls). It does nothing when nothing is
// staged.
func (w *Writer) Publish() {
	if w.m == nil || w.tail == w.published {
		return
	}
	storeTail(w.m, w.tail) // release: publishes every record byte staged since the last Publish
	w.published = w.tail
	// After the tail store (a full fence on amd64): the producer half of the Dekker pair.
	if p := loadParked(w.m); p != 0 && (p == 1 || w.backlogReaches(p)) {
		futexWakeAll(tailFutex(w.m))
	}
}

// backlogReaches reports whether the published bytes past the consumer's head reach a doorbell level (FORMAT.md,
// "Doorbell"). The cached head is older than the header's, so a backlog below the level by it is below the level
// for sure; otherwise the head is loaded once (not cached: the cache is the free-space check's).
func (w *Writer) backlogReaches(level uint32) bool {
	if w.published-w.headCache < uint64(level) {
		return false
	}
	return w.published-loadHead(w.m) >= uint64(level)
}

// WriteBatch writes one BATCH record of (ts, subs) (layout: AppendBatch), preceded by a LOSS record if a loss is
// pending, and publishes both with one tail store, like WriteEvent. It returns true when the batch was written.
// When it does not fit (ring full, or its record exceeds max_record) it writes nothing and returns false at once,
// without counting a drop: the ring does not read the events' seqs, so a producer that accounts losses calls
// CountDrop with the batch's seq. subs breaking the layout rules (empty, unknown sub-type, META not followed by an
// EVENT) return an error wrapping ErrMalformedBatch before anything is staged; a closed Writer returns ErrClosed.
func (w *Writer) WriteBatch(ts float64, subs []Sub) (bool, error) {
	if w.m == nil {
		return false, ErrClosed
	}
	var err error
	if w.batchBuf, err = AppendBatch(w.batchBuf[:0], ts, subs); err != nil {
		return false, err
	}
	if uint64(RecordHeaderSize)+uint64(len(w.batchBuf)) > w.maxRecord {
		w.Publish()
		return false, nil
	}
	if !w.appendAfterLoss(TypeBatch, w.batchBuf) {
		w.Publish()
		return false, nil
	}
	w.publishAfterLoss()
	return true, nil
}

// CountDrop counts one dropped event (or batch) with seq and n payload bytes, as WriteEvent does for an event that
// does not fit: the header's loss counters, and a LOSS record before the next record that fits.
func (w *Writer) CountDrop(seq uint64, n int) {
	if w.m != nil {
		w.drop(seq, n)
	}
}

// WriteEvent stages a LOSS record if a loss is pending, then an EVENT record with payload, and publishes both with
// one tail store. When the event does not fit it writes nothing, counts the drop (dropped_events, dropped_bytes,
// the pending loss range in the header) and returns ErrFull at once; an event whose record exceeds max_record is
// dropped and counted the same way and yields ErrTooLarge. Records staged earlier with Append are published in
// every case.
func (w *Writer) WriteEvent(seq uint64, payload []byte) error {
	if w.m == nil {
		return ErrClosed
	}
	if uint64(RecordHeaderSize)+uint64(len(payload)) > w.maxRecord {
		w.drop(seq, len(payload))
		w.Publish()
		return ErrTooLarge
	}
	if !w.appendAfterLoss(TypeEvent, payload) {
		w.drop(seq, len(payload))
		w.Publish()
		return ErrFull
	}
	w.publishAfterLoss()
	return nil
}

// appendAfterLoss stages the pending LOSS record (if a loss is pending), then a record of typ. When either does not
// fit it leaves nothing of the two staged (records staged earlier stay) and returns false; the caller publishes.
func (w *Writer) appendAfterLoss(typ uint32, payload []byte) bool {
	mark, pub := w.tail, w.published
	if w.lossPending {
		le := binary.LittleEndian
		le.PutUint64(w.lossBuf[0:], w.lossFirst)
		le.PutUint64(w.lossBuf[8:], w.lossLast)
		le.PutUint64(w.lossBuf[16:], w.lossCount)
		if !w.Append(TypeLoss, w.lossBuf[:]) {
			return false
		}
	}
	if !w.Append(typ, payload) {
		if w.published == pub { // else reserve re-based the ring at the consumer's head: nothing to unstage
			w.tail = mark // unstage the LOSS record (never published)
		}
		return false
	}
	return true
}

// publishAfterLoss publishes what appendAfterLoss staged and clears the pending loss its LOSS record reports.
func (w *Writer) publishAfterLoss() {
	w.Publish()
	if w.lossPending {
		// After the tail store: a consumer may briefly see loss_pending=1 next to the LOSS record that reports it;
		// the LOSS record in the stream is authoritative.
		w.lossPending, w.lossCount = false, 0
		storeCounter(w.m, offLossPending, 0)
	}
}

// drop counts one dropped event of n payload bytes and extends the pending loss range.
func (w *Writer) drop(seq uint64, n int) {
	w.droppedEvents++
	w.droppedBytes += uint64(n)
	w.lossCount++
	if !w.lossPending {
		w.lossFirst = seq
		storeCounter(w.m, offLossFirstSeq, seq)
	}
	w.lossLast = seq
	storeCounter(w.m, offLossLastSeq, seq)
	storeCounter(w.m, offDroppedEvents, w.droppedEvents)
	storeCounter(w.m, offDroppedBytes, w.droppedBytes)
	if !w.lossPending {
		w.lossPending = true
		storeCounter(w.m, offLossPending, 1) // release: after loss_first_seq and loss_last_seq
	}
}

// Header returns a copy of the ring's static header fields and state.
func (w *Writer) Header() Header {
	if w.m == nil {
		return Header{}
	}
	h := parseHeader(w.m)
	h.State = loadState(w.m)
	return h
}

// Stats returns a snapshot of the shared counters.
func (w *Writer) Stats() RingStats {
	if w.m == nil {
		return RingStats{}
	}
	st := liveStats(w.m, w.capacity, 0)
	st.ReadPos = st.Head
	return st
}

// Close publishes staged records, stores state CLOSED, unmaps the ring and releases the lock. It does not remove
// the file: the consumer may still drain it.
func (w *Writer) Close() error {
	if w.m == nil {
		return ErrClosed
	}
	w.Publish()
	storeState(w.m, StateClosed) // release: after the last tail store
	err := unmap(w.m)
	w.m, w.data = nil, nil
	// Closing the descriptor releases the flock.
	if cerr := w.f.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("close ring file: %w", cerr))
	}
	w.f = nil
	if err != nil {
		return fmt.Errorf("close ring %s: %w", w.path, err)
	}
	return nil
}

// liveStats loads the shared counters of a live mapping; readPos is reported as ReadPos.
func liveStats(m []byte, capacity, readPos uint64) RingStats {
	st := RingStats{
		Head:              loadHead(m),
		Tail:              loadTail(m),
		ReadPos:           readPos,
		Capacity:          capacity,
		DroppedEvents:     loadCounter(m, offDroppedEvents),
		DroppedBytes:      loadCounter(m, offDroppedBytes),
		LossPending:       loadCounter(m, offLossPending) != 0,
		ConsumerHeartbeat: loadCounter(m, offHeartbeat),
		State:             loadState(m),
	}
	if st.LossPending {
		st.LossFirstSeq = loadCounter(m, offLossFirstSeq)
		st.LossLastSeq = loadCounter(m, offLossLastSeq)
	}
	if checkPositions(st.Head, st.Tail, capacity) == nil {
		st.Used = st.Tail - st.Head
	}
	return st
}
