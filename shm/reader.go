package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Record is one EVENT, LOSS or BATCH record returned by Reader.Next (Batch parses a BATCH's payload). Payload aliases the mapping: it is valid until the
// next Release (or SkipToTail, or Close), after which the producer may overwrite it. Copy what you keep.
type Record struct {
	Type    uint32
	Pos     uint64 // ring position of the record header
	Payload []byte // length-8 bytes; capacity limited to the payload
}

// Loss decodes a LOSS record's payload: the producer dropped count events with seqs in [first, last]. It returns
// ok=false for any other record.
func (r Record) Loss() (first, last, count uint64, ok bool) {
	if r.Type != TypeLoss || len(r.Payload) != LossPayloadSize {
		return 0, 0, 0, false
	}
	le := binary.LittleEndian
	return le.Uint64(r.Payload[0:]), le.Uint64(r.Payload[8:]), le.Uint64(r.Payload[16:]), true
}

// Reader is the consumer side of a ring. It is owned by one goroutine: no method may run concurrently with
// another, except Wake, which any goroutine may call at any time (also during Park and after Close). It never
// reads outside the mapping, whatever the producer wrote, and blocks only in Park.
type Reader struct {
	f     *os.File // nil for in-memory images and after Close
	m     []byte   // the whole mapping; nil after Close
	data  []byte   // m[HeaderSize:]
	path  string
	unmap func([]byte) error

	hdr Header // static fields, validated at Open; never re-read (the producer could change them)

	capacity  uint64
	mask      uint64
	maxRecord uint64

	pos  uint64 // next record to read. Owned by the reader.
	head uint64 // last head stored into the header. Owned by the reader.
	tail uint64 // last valid tail loaded from the header. Owned by the reader.

	// Doorbell (Park, Wake).
	wakeMu  sync.Mutex  // held by Wake while it rings and by Close while it drops futex
	futex   *uint32     // low half of the tail word; nil after Close. Written under wakeMu by the owner.
	parking atomic.Bool // Park is between its wake check and its return. Updated atomically.
	wakeReq atomic.Bool // a Wake that Park or Nap has not consumed yet. Updated atomically.
	napping atomic.Bool // Nap is between its wake check and its return. Updated atomically.
	napWord uint32      // Nap's process-private futex word (never written: only its address matters)

	// Arm state (Arm, Disarm, Doorbells.Wait). Owned by the reader.
	armed     bool   // consumer_parked was stored by Arm and not cleared since
	armedWord uint32 // the consumer_parked value Arm stored (see parkedWord)
	armedTail uint32 // low half of the tail word Arm loaded after storing consumer_parked
	level     uint32 // SetDoorbellLevel's unread bytes (1: every publication). Owned by the reader.
}

// Open maps an existing ring for its consumer. It validates the magic (ErrMagic), the version (ErrVersion), the
// static header fields and the file size (ErrHeader), the state (ErrNotReady while the creator is still writing
// the header) and the head/tail words (*CorruptionError), and resumes at the persisted head. Open takes no lock:
// there must be one consumer per ring.
func Open(path string) (*Reader, error) {
	if !nativeLittleEndian {
		return nil, ErrPlatform
	}
	f, size, err := openChecked(path, os.O_RDWR)
	if err != nil {
		return nil, fmt.Errorf("open ring %s: %w", path, err)
	}
	m, err := mapFile(f, size)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open ring %s: %w", path, err)
	}
	r, err := newReader(m, unmap)
	if err != nil {
		unmap(m)
		f.Close()
		return nil, fmt.Errorf("open ring %s: %w", path, err)
	}
	r.f, r.path = f, path
	return r, nil
}

// newReader validates the ring image m (a mapping, or a heap copy in tests) and returns a Reader over it. release
// is called with m by Close.
func newReader(m []byte, release func([]byte) error) (*Reader, error) {
	if err := checkAtomicAlignment(m); err != nil {
		return nil, err
	}
	st := loadState(m) // acquire: pairs with the creator's READY store, so the static fields below are complete
	h := parseHeader(m)
	h.State = st
	if err := h.validate(int64(len(m))); err != nil {
		return nil, err
	}
	if st == StateInit {
		return nil, ErrNotReady
	}
	head := loadHead(m) // our own (or a previous consumer's) persisted position
	tail := loadTail(m) // acquire: pairs with the producer's last tail store
	if err := checkPositions(head, tail, h.Capacity); err != nil {
		return nil, err
	}
	// A consumer that died in Park left consumer_parked = 1, which would cost the producer a futex call per publish.
	storeParked(m, 0)
	return &Reader{
		m: m, data: m[HeaderSize:], unmap: release, hdr: h,
		capacity: h.Capacity, mask: h.Capacity - 1, maxRecord: uint64(h.MaxRecord),
		pos: head, head: head, tail: head, futex: tailFutex(m), level: 1,
	}, nil
}

// Header returns the static header fields validated at Open, with the current state.
func (r *Reader) Header() Header {
	h := r.hdr
	if r.m != nil {
		h.State = loadState(r.m)
	}
	return h
}

// Next returns the next published record, skipping padding. It returns ErrEmpty when none is left (call Release
// and poll again later) and a *CorruptionError (errors.Is ErrCorrupt) when the bytes at the read position or the
// tail word are invalid; the error repeats until SkipToTail. Next never allocates on success.
func (r *Reader) Next() (Record, error) {
	// Fast path, small enough to be inlined into the drain loop: an EVENT record inside [pos, tail). Everything
	// else (empty, tail reload, padding, LOSS, corruption, closed) takes next.
	if pos := r.pos; pos != r.tail {
		idx := pos & r.mask
		h := binary.LittleEndian.Uint64(r.data[idx:])
		length, size := h&0xFFFFFFFF, align8(h&0xFFFFFFFF)
		if h>>32 == uint64(TypeEvent) && length >= RecordHeaderSize && length <= r.maxRecord &&
			size <= r.capacity-idx && size <= r.tail-pos {
			r.pos = pos + size
			return Record{Type: TypeEvent, Pos: pos, Payload: r.data[idx+RecordHeaderSize : idx+length : idx+length]}, nil
		}
	}
	return r.next()
}

// next is the complete Next: it reloads the tail, skips padding and validates every record type.
func (r *Reader) next() (Record, error) {
	if r.m == nil {
		return Record{}, ErrClosed
	}
	for {
		if r.pos == r.tail {
			t := loadTail(r.m) // acquire: the records in [r.pos, t) are complete
			if t == r.tail {
				return Record{}, ErrEmpty
			}
			if err := r.checkTail(t); err != nil {
				return Record{}, err
			}
			r.tail = t
		}
		// r.pos is a multiple of 8 and r.pos < r.tail, so the 8 header bytes lie inside the data area.
		idx := r.pos & r.mask
		length := uint64(binary.LittleEndian.Uint32(r.data[idx:]))
		typ := binary.LittleEndian.Uint32(r.data[idx+4:])
		room := r.capacity - idx // bytes to the end of the data area
		avail := r.tail - r.pos  // published bytes from the read position
		if typ == TypePadding {
			if length != room || length > avail {
				return Record{}, r.badRecord(length, typ, room, avail)
			}
			r.pos += length
			continue
		}
		size := align8(length)
		if (typ != TypeEvent && typ != TypeBatch && (typ != TypeLoss || length != lossRecordSize)) ||
			length < RecordHeaderSize || length > r.maxRecord || size > room || size > avail {
			return Record{}, r.badRecord(length, typ, room, avail)
		}
		rec := Record{Type: typ, Pos: r.pos, Payload: r.data[idx+RecordHeaderSize : idx+length : idx+length]}
		r.pos += size
		return rec, nil
	}
}

// badRecord explains why the record header (length, typ) at the read position failed validation in Next. It is
// kept out of Next so the hot path carries no formatting code.
//
//go:noinline
func (r *Reader) badRecord(length uint64, typ uint32, room, avail uint64) error {
	switch {
	case typ == TypePadding && length != room:
		return corruptf(r.pos, "padding length %d, want %d (the bytes to the end)", length, room)
	case typ == TypePadding:
		return corruptf(r.pos, "padding of %d bytes runs past the tail (%d bytes published)", length, avail)
	case typ != TypeEvent && typ != TypeLoss && typ != TypeBatch:
		return corruptf(r.pos, "unknown record type %#x", typ)
	case length < RecordHeaderSize:
		return corruptf(r.pos, "record length %d is shorter than its header", length)
	case length > r.maxRecord:
		return corruptf(r.pos, "record length %d exceeds max_record %d", length, r.maxRecord)
	case align8(length) > room:
		return corruptf(r.pos, "record of %d bytes crosses the end of the data area (%d bytes left)", length, room)
	case align8(length) > avail:
		return corruptf(r.pos, "record of %d bytes runs past the tail (%d bytes published)", length, avail)
	default:
		return corruptf(r.pos, "LOSS record length %d, want %d", length, lossRecordSize)
	}
}

// checkTail validates a newly loaded tail against the reader's positions. The producer can only have written up
// to head+capacity, so anything else is corruption (or a hostile producer).
func (r *Reader) checkTail(t uint64) error {
	switch {
	case t%RecordAlign != 0:
		return corruptf(r.pos, "tail %d is not a multiple of %d", t, RecordAlign)
	case t < r.pos:
		return corruptf(r.pos, "tail %d moved behind the read position %d", t, r.pos)
	case t-r.head > r.capacity:
		return corruptf(r.pos, "tail %d is more than capacity %d ahead of head %d", t, r.capacity, r.head)
	}
	return nil
}

// Release publishes the head: everything before the end of the last record returned by Next (and any padding
// skipped after it) is handed back to the producer. Call it once per drained batch, after the last use of the
// batch's payloads.
func (r *Reader) Release() {
	if r.m == nil || r.pos == r.head {
		return
	}
	storeHead(r.m, r.pos) // release: our reads of [old head, pos) happen before the producer may reuse them
	r.head = r.pos
}

// ReleaseTo publishes the head up to pos, which must be a record boundary at or after the current head and at or
// before the read position: the records before pos are handed back to the producer, the ones read after it stay
// reserved (their payloads stay valid) until a later release. A consumer uses it to release exactly the position
// it durably recorded (a checkpoint taken at pos) while it went on reading. The ordering is Release's: the store
// is a release, so our reads of [old head, pos) happen before the producer may reuse them.
//
// A pos behind the head or past the read position, or one not a multiple of RecordAlign, is a programmer error:
// ReleaseTo returns an error wrapping ErrReleasePos and leaves the head where it was. An aligned pos inside a
// record cannot be detected without walking the records (it is not): the producer would merely get back part of
// a record already read, but a consumer that resumes at that head (Open) would report corruption there.
func (r *Reader) ReleaseTo(pos uint64) error {
	if r.m == nil {
		return ErrClosed
	}
	if pos < r.head || pos > r.pos || pos%RecordAlign != 0 {
		return fmt.Errorf("release to %d (head %d, read position %d): %w", pos, r.head, r.pos, ErrReleasePos)
	}
	if pos == r.head {
		return nil
	}
	storeHead(r.m, pos) // release: our reads of [old head, pos) happen before the producer may reuse them
	r.head = pos
	return nil
}

// SkipToTail abandons every unread byte: head and the read position jump to the published tail. Use it after a
// *CorruptionError; the records in between are lost (account for them as unknown history). When the tail word
// itself is invalid (unaligned or behind head) nothing can be repaired and Next keeps failing until the producer
// publishes a valid tail again.
func (r *Reader) SkipToTail() {
	if r.m == nil {
		return
	}
	t := loadTail(r.m) // acquire, as in Next
	// A tail word no producer can have stored (misaligned, behind head, more than capacity ahead of it) is not a
	// position to skip to: storing it as head would leave the producer a ring it can never write again. Stay, and
	// let the producer's next publish rewrite the word.
	if t%RecordAlign != 0 || t < r.head || t-r.head > r.capacity {
		return
	}
	r.pos, r.tail = t, t
	r.Release()
}

// SkipTo moves the read position forward to pos without returning the records before it, and releases the head
// there. pos must be where walking the published records from the read position ends a record (so it is the end
// of a record the producer wrote, never the middle of one); otherwise SkipTo returns an error wrapping ErrCorrupt
// and leaves the Reader as it was. A consumer uses it to resume a ring at a position it had durably recorded (its
// checkpoint) but not yet released when it died.
func (r *Reader) SkipTo(pos uint64) error {
	if r.m == nil {
		return ErrClosed
	}
	from, tail := r.pos, r.tail
	for r.pos < pos {
		if _, err := r.Next(); err != nil {
			published := r.tail
			r.pos, r.tail = from, tail
			if errors.Is(err, ErrEmpty) {
				return corruptf(from, "skip to %d: the records published end at %d", pos, published)
			}
			return fmt.Errorf("skip to %d: %w", pos, err)
		}
	}
	if r.pos != pos {
		end := r.pos
		r.pos, r.tail = from, tail
		return corruptf(from, "skip to %d: not the end of a record (one ends at %d)", pos, end)
	}
	r.Release()
	return nil
}

// Truncated reports whether the ring file is now shorter than the mapping (another process truncated it): any
// access to the mapping past the file's end is a SIGBUS, and a reader that only touches the header page (an idle
// consumer) would not notice otherwise. It costs one fstat; false when the Reader was not opened from a file.
func (r *Reader) Truncated() (bool, int64) {
	if r.f == nil {
		return false, 0
	}
	fi, err := r.f.Stat()
	if err != nil {
		return false, 0
	}
	return fi.Size() < int64(HeaderSize)+int64(r.capacity), fi.Size()
}

// Published returns the producer's tail word (acquire) and whether its header reports a pending loss. Unlike the
// other methods it may be called from any goroutine, provided the caller keeps Close from running meanwhile; a
// consumer uses it to see that it has already applied everything published (tail == its read position, no loss
// pending) without a round trip to the goroutine that owns the Reader.
func (r *Reader) Published() (tail uint64, lossPending bool) {
	tail = loadTail(r.m) // acquire: pairs with the producer's tail store
	return tail, loadCounter(r.m, offLossPending) != 0
}

// Heartbeat stores the consumer heartbeat word (unix ns of the last drain pass; informational only).
func (r *Reader) Heartbeat(unixNano int64) {
	if r.m == nil {
		return
	}
	storeCounter(r.m, offHeartbeat, uint64(unixNano))
}

// Park blocks until the producer publishes past the read position, Wake is called, or timeout passes, and reports
// whether there may be something to do: true when records are published past the read position or a Wake arrived
// (before or during the call), false on timeout. With a doorbell level above 1 (SetDoorbellLevel) it sleeps while
// fewer unread bytes than the level are published, and only a publication reaching it rings. It may return false
// early (a signal, a spurious futex wakeup): the caller polls Next and parks again. Call it only after Next
// returned ErrEmpty (with a level's worth of unread records it returns true at once), and Release first: the
// producer cannot reuse unreleased bytes while the consumer sleeps.
//
// The doorbell (FORMAT.md, "Doorbell"): Park stores consumer_parked = 1, loads the tail again, and only if nothing
// new is there sleeps in FUTEX_WAIT on the low 32 bits of the tail word, expecting the value it loaded; then it
// stores consumer_parked = 0. A producer loads consumer_parked after each tail store and, when it is set, calls
// FUTEX_WAKE on the tail word. Each side's store is ordered before its following load (XCHG on amd64, STLR then
// LDAR on arm64: the Go Writer, Park, and the Python writer's extension), so no wakeup is lost between them; the
// x86-64 pure-Python fallback cannot fence (its store(tail) -> load(parked) may be reordered), so its wakeup can be
// lost, and timeout is what bounds that delay. An invalid tail word (corruption)
// does not count as new records: Park waits for the producer to change it.
func (r *Reader) Park(timeout time.Duration) bool {
	woken, _ := r.park(timeout)
	return woken
}

// park is Park; timedOut reports that the futex wait ended with ETIMEDOUT (tests assert a wake never needs it).
func (r *Reader) park(timeout time.Duration) (woken, timedOut bool) {
	if r.m == nil {
		return false, false
	}
	if r.due(r.tail) {
		return true, false
	}
	r.parking.Store(true) // from here on a Wake keeps ringing until park returns (see Wake)
	defer r.parking.Store(false)
	if r.wakeReq.Swap(false) {
		return true, false
	}
	storeParked(r.m, r.parkedWord()) // seq-cst: visible before the tail load below (consumer half of the Dekker pair)
	t := loadTail(r.m)
	if !r.due(t) && !r.wakeReq.Load() {
		// EAGAIN at once if the tail's low half changed since the load. (A change by exactly a multiple of 2^32
		// bytes in between would go unnoticed until a wake or the timeout: impossible in practice.)
		timedOut = futexWaitTimeout(r.futex, uint32(t), timeout) == unix.ETIMEDOUT
		t = loadTail(r.m)
	}
	storeParked(r.m, 0)
	r.armed = false
	return r.wakeReq.Swap(false) || r.tailMoved(t), timedOut
}

// SetDoorbellLevel sets how many unread bytes past the read position make the producer ring the doorbell of an
// armed or parked ring (FORMAT.md, "Doorbell"): 0 or 1, every publication (the default); more, a lazy consumer
// that is content to find smaller backlogs when it wakes for something else (its own deadline, another ring, a
// Wake). It takes effect at the next Arm or Park. A producer that predates levels rings at every publication.
func (r *Reader) SetDoorbellLevel(bytes uint32) { r.level = max(bytes, 1) }

// DoorbellLevel returns the level SetDoorbellLevel set (1: every publication).
func (r *Reader) DoorbellLevel() uint32 { return r.level }

// parkedWord is the consumer_parked value for the current level: 1 rings at every publication; a level L rings
// when the producer's tail is L bytes past the read position, i.e. tail - head >= (pos - head) + L, since the
// producer sees only the head (which lags the read position while a checkpoint holds records back: ReleaseTo).
func (r *Reader) parkedWord() uint32 {
	if r.level <= 1 {
		return 1
	}
	return uint32(min(r.pos-r.head+uint64(r.level), math.MaxUint32))
}

// due reports whether the tail word t (just loaded, or the cached tail) holds at least a doorbell level of unread
// bytes past the read position: with level 1, any record. An invalid tail word is not records.
func (r *Reader) due(t uint64) bool {
	if t != r.tail && r.checkTail(t) != nil {
		t = r.tail
	}
	return t-r.pos >= uint64(r.level)
}

// tailMoved reports whether t, a tail word loaded at the read position r.pos == r.tail, publishes new records.
func (r *Reader) tailMoved(t uint64) bool { return t != r.tail && r.checkTail(t) == nil }

// Arm is Park's first half for a consumer that waits on many rings at once (Doorbells.Wait): it stores
// consumer_parked (1, or the doorbell level's word: SetDoorbellLevel) seq-cst and loads the tail again. It returns
// false, with consumer_parked cleared again, when the level is reached (with level 1: records past the read
// position, published before or after the store): drain first. Below a level, unread records stay unread until
// the consumer drains for another reason. Otherwise the ring stays armed (its producer's next publish rings the
// doorbell) until Disarm, Park or a Doorbells.Wait that finds it moved; arming an armed ring only re-checks the
// tail. Call it after Next returned ErrEmpty, and Release first, as for Park. The ordering argument is Park's
// (FORMAT.md, "Doorbell"): the store of consumer_parked is a full fence before the tail load, so a Go producer that
// stores the tail after that load sees the flag and rings, and one that stored it before is seen by the load; an
// invalid tail word is not new records.
func (r *Reader) Arm() bool {
	if r.m == nil {
		return false
	}
	if r.due(r.tail) {
		r.Disarm()
		return false
	}
	if w := r.parkedWord(); !r.armed || r.armedWord != w {
		storeParked(r.m, w) // seq-cst: visible before the tail load below (consumer half of the Dekker pair)
		r.armed, r.armedWord = true, w
	}
	t := loadTail(r.m)
	if r.due(t) {
		r.Disarm()
		return false
	}
	r.armedTail = uint32(t)
	return true
}

// Disarm clears consumer_parked if Arm set it (the producer stops ringing). A consumer disarms a ring before it
// drains it, so a producer publishing to a ring whose consumer is awake makes no system call.
func (r *Reader) Disarm() {
	if !r.armed {
		return
	}
	r.armed = false
	if r.m != nil {
		storeParked(r.m, 0)
	}
}

// Armed reports whether the ring is armed (Arm returned true and nothing disarmed it since).
func (r *Reader) Armed() bool { return r.armed }

// Pending reports whether Next may return a record: a tail word past the read position that is a valid tail
// (one load; an invalid tail word is not records, as for Park). It does not touch consumer_parked.
func (r *Reader) Pending() bool {
	if r.m == nil {
		return false
	}
	return r.pos != r.tail || r.tailMoved(loadTail(r.m))
}

// PendingLoss returns the producer's pending drop episode from the ring header (loss_pending and the seq range:
// three gauges loaded one by one, so a read may be torn across two episodes; see Stats).
func (r *Reader) PendingLoss() (pending bool, first, last uint64) {
	if r.m == nil {
		return false, 0, 0
	}
	if loadCounter(r.m, offLossPending) == 0 { // acquire: the range below was stored before it
		return false, 0, 0
	}
	return true, loadCounter(r.m, offLossFirstSeq), loadCounter(r.m, offLossLastSeq)
}

// Nap sleeps up to d unless Wake is called (before or during it), and reports whether it was woken. Unlike Park
// it does not set consumer_parked, so a producer publishing meanwhile makes no system call and is reached only
// when the nap ends: a consumer naps for short backoff sleeps while records are still likely to come, and a Wake
// (a query waiting for what was just published) cuts the nap short. It sleeps on a word of this process
// (FUTEX_PRIVATE); timedOut says the wait ended with ETIMEDOUT.
func (r *Reader) Nap(d time.Duration) (woken bool) {
	woken, _ = r.nap(d)
	return woken
}

func (r *Reader) nap(d time.Duration) (woken, timedOut bool) {
	r.napping.Store(true) // from here on a Wake keeps ringing until nap returns (see Wake)
	defer r.napping.Store(false)
	if r.wakeReq.Swap(false) {
		return true, false
	}
	timedOut = futexWaitPrivate(&r.napWord, 0, d) == unix.ETIMEDOUT
	return r.wakeReq.Swap(false), timedOut
}

// Wake makes the current Park or Nap return (true) at once, or the next one if none is in progress. Safe for
// concurrent use with every method, including Close; it does nothing to the ring. A FUTEX_WAKE can reach the
// kernel before the sleeper's FUTEX_WAIT does (the word did not change, so the wait still starts), so Wake repeats
// it until the sleeper has returned; that window is a few instructions, longer only if the sleeper's thread is
// descheduled right there.
func (r *Reader) Wake() {
	r.wakeReq.Store(true) // seq-cst, before the parking/napping loads: pairs with their stores and wakeReq swaps
	r.wakeMu.Lock()
	defer r.wakeMu.Unlock()
	for i := 0; r.napping.Load() || (r.futex != nil && r.parking.Load()); i++ {
		n := futexWakePrivate(&r.napWord)
		if r.futex != nil && r.parking.Load() {
			n += futexWakeAll(r.futex)
		}
		if n > 0 {
			return // the ring's one consumer is awake (one consumer per ring)
		}
		if i < 16 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// Stats returns a snapshot of the shared counters; ReadPos is the position of the next Next.
func (r *Reader) Stats() RingStats {
	if r.m == nil {
		return RingStats{}
	}
	return liveStats(r.m, r.capacity, r.pos)
}

// Close unmaps the ring. The head is not released implicitly: call Release first for the records you are done
// with. Close does not touch the mapping (a truncated ring's may fault): Disarm first an armed ring whose mapping
// is sound, or its producer keeps ringing until the ring is opened again. Payloads returned by Next must not be used after Close (the memory is gone: a fault, not an error).
func (r *Reader) Close() error {
	if r.m == nil {
		return ErrClosed
	}
	r.wakeMu.Lock() // no Wake may ring an address that is about to be unmapped
	r.futex = nil
	r.armed = false
	r.wakeMu.Unlock()
	var err error
	if r.unmap != nil {
		err = r.unmap(r.m)
	}
	r.m, r.data = nil, nil
	r.tail = r.pos // keeps Next off its fast path: it returns ErrClosed
	if r.f != nil {
		if cerr := r.f.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close ring file: %w", cerr))
		}
		r.f = nil
	}
	if err != nil {
		return fmt.Errorf("close ring %s: %w", r.path, err)
	}
	return nil
}
