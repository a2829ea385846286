package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format: never change without bumping the version.
//
// Every offset below is relative to the start of the ring file. The header page holds the static fields written
// once by the creator, then one 128-byte slot per shared counter so that the producer's and the consumer's words
// never share a cache line (two 64-byte lines per slot also defeat the adjacent-line prefetcher). FORMAT.md has the
// byte diagram.
const (
	// Magic identifies a kvshm ring file.
	Magic = "KVSHMRG\x00"
	// Version is the layout version this package reads and writes.
	Version uint32 = 1
	// HeaderSize is the size of the header page; the data area starts right after it.
	HeaderSize = 4096

	slotSize = 128 // one shared counter group per slot

	offMagic         = 0x000
	offVersion       = offMagic + 8   // 0x008
	offHeaderSize    = offVersion + 4 // 0x00C
	offCapacity      = offHeaderSize + 4
	offMaxRecord     = offCapacity + 8 // 0x018
	offFlags         = offMaxRecord + 4
	offProducerPID   = offFlags + 4       // 0x020
	offProducerStart = offProducerPID + 8 // 0x028 (4 reserved bytes after the pid)
	offEpoch         = offProducerStart + 8
	offWorkerID      = offEpoch + 8 // 0x038
	offKVBlockSize   = offWorkerID + 8
	offMaxBufferSize = offKVBlockSize + 4
	offState         = offMaxBufferSize + 4 // 0x048 (4 reserved bytes after it)

	offTail          = 1 * slotSize // 0x080, producer
	offHead          = 2 * slotSize // 0x100, consumer
	offDroppedEvents = 3 * slotSize // 0x180, producer: loss accounting group
	offDroppedBytes  = offDroppedEvents + 8
	offLossFirstSeq  = offDroppedBytes + 8
	offLossLastSeq   = offLossFirstSeq + 8
	offLossPending   = offLossLastSeq + 8
	offHeartbeat     = 4 * slotSize     // 0x200, consumer
	offParked        = offHeartbeat + 8 // 0x208, consumer: u32 doorbell flag (4 reserved bytes after it)

	// RecordHeaderSize is the size of the [u32 length][u32 type] record header.
	RecordHeaderSize = 8
	// RecordAlign is the alignment of every record start; a record occupies align8(length) bytes.
	RecordAlign = RecordHeaderSize
	// LossPayloadSize is the exact payload size of a LOSS record: first_seq, last_seq, count (u64 each).
	LossPayloadSize = 24
	lossRecordSize  = RecordHeaderSize + LossPayloadSize

	// MinCapacity and MaxCapacity bound the data area size (a power of two).
	MinCapacity = 64 << 10
	MaxCapacity = 4 << 30
	// MinMaxRecord is the smallest allowed max_record: a LOSS record must always fit.
	MinMaxRecord = lossRecordSize
	// maxRecordDivisor bounds max_record to capacity/8, which keeps the padding waste at the wrap bounded.
	maxRecordDivisor = 8
)

// Record types.
const (
	TypeEvent   uint32 = 1          // payload: a kvevent.Event FlatBuffer (opaque to this package)
	TypeLoss    uint32 = 2          // payload: first_seq u64, last_seq u64, count u64
	TypeBatch   uint32 = 3          // payload: ts f64, count u32, flags u32, count sub-records (batch.go)
	TypePadding uint32 = 0xFFFFFFFF // fills the bytes to the end of the data area; skipped by Next
)

// State is the ring's life-cycle word (offset 0x048).
type State uint32

// States of a ring.
const (
	StateInit   State = 0 // being created: header not complete
	StateReady  State = 1 // header complete, producer running (or died without closing)
	StateClosed State = 2 // producer closed cleanly
)

func (s State) String() string {
	switch s {
	case StateInit:
		return "INIT"
	case StateReady:
		return "READY"
	case StateClosed:
		return "CLOSED"
	}
	return fmt.Sprintf("State(%d)", uint32(s))
}

// DefaultCapacity is the data area size Create uses when Options.Capacity is 0.
const DefaultCapacity = 16 << 20

var (
	// ErrEmpty is returned by Reader.Next when no published record is left to read.
	ErrEmpty = errors.New("kvshm/shm: ring empty")
	// ErrFull is returned by Writer.WriteEvent when the record did not fit; the drop has been counted.
	ErrFull = errors.New("kvshm/shm: ring full")
	// ErrTooLarge is returned by Writer.WriteEvent when the record exceeds max_record; the drop has been counted.
	ErrTooLarge = errors.New("kvshm/shm: record too large")
	// ErrReleasePos is returned by Reader.ReleaseTo for a position outside [head, read position] or unaligned.
	ErrReleasePos = errors.New("kvshm/shm: release position outside [head, read position]")
	// ErrCorrupt is wrapped by every *CorruptionError.
	ErrCorrupt = errors.New("kvshm/shm: corrupt ring")
	// ErrMagic is returned by Open and Inspect when the file does not start with Magic.
	ErrMagic = errors.New("kvshm/shm: not a kvshm ring (bad magic)")
	// ErrVersion is returned by Open and Inspect when the file's layout version is not Version.
	ErrVersion = errors.New("kvshm/shm: unsupported ring layout version")
	// ErrHeader is returned by Open and Inspect when a static header field or the file size is invalid.
	ErrHeader = errors.New("kvshm/shm: invalid ring header")
	// ErrNotReady is returned by Open when the creator has not finished writing the header (state INIT).
	ErrNotReady = errors.New("kvshm/shm: ring not ready")
	// ErrLocked is returned by Create when another producer holds the ring file's lock.
	ErrLocked = errors.New("kvshm/shm: ring is locked by another producer")
	// ErrExist is returned by Create when the file exists and no producer holds it (a stale ring).
	ErrExist = errors.New("kvshm/shm: ring file already exists")
	// ErrNoSpace is returned by Create when the file system cannot hold the whole ring.
	ErrNoSpace = errors.New("kvshm/shm: no space for the ring file")
	// ErrOptions is returned by Create for invalid Options.
	ErrOptions = errors.New("kvshm/shm: invalid options")
	// ErrClosed is returned when a closed Writer or Reader is used.
	ErrClosed = errors.New("kvshm/shm: ring closed")
	// ErrPlatform is returned by Create and Open on a big-endian machine.
	ErrPlatform = errors.New("kvshm/shm: unsupported platform (the ring is little-endian)")
)

// CorruptionError reports invalid bytes found in the ring: a record or a position word that no correct producer
// writes. Pos is the ring position (byte counter, not index) of the offending record, or of the read position when
// a head or tail word is invalid.
type CorruptionError struct {
	Pos    uint64
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("kvshm/shm: corrupt ring at position %d: %s", e.Pos, e.Reason)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptionError) Unwrap() error { return ErrCorrupt }

func corruptf(pos uint64, format string, args ...any) *CorruptionError {
	return &CorruptionError{Pos: pos, Reason: fmt.Sprintf(format, args...)}
}

// Header is a copy of the static header fields and the state word.
type Header struct {
	Magic             [8]byte
	Version           uint32
	HeaderSize        uint32
	Capacity          uint64
	MaxRecord         uint32
	Flags             uint32
	ProducerPID       uint32
	ProducerStartTime uint64 // field 22 of /proc/<pid>/stat: clock ticks since boot
	Epoch             uint64 // creation time in unix ns; identifies the producer incarnation
	WorkerID          uint64
	KVBlockSize       uint32
	MaxBufferSize     uint32
	State             State
}

// RingStats is a snapshot of the shared counters. The words are loaded one by one, so the snapshot is not atomic
// as a whole: treat the values as gauges.
type RingStats struct {
	Head              uint64 // published consumer position
	Tail              uint64 // published producer position
	ReadPos           uint64 // Reader only: position of the next Next (>= Head until Release)
	Used              uint64 // Tail-Head, or 0 when the positions violate the invariants
	Capacity          uint64
	DroppedEvents     uint64
	DroppedBytes      uint64 // payload bytes of the dropped events
	LossPending       bool   // a loss not yet reported by a LOSS record
	LossFirstSeq      uint64 // valid when LossPending
	LossLastSeq       uint64 // valid when LossPending
	ConsumerHeartbeat uint64 // unix ns of the consumer's last drain pass, 0 if never
	State             State
}

// parseHeader decodes the static fields of the header page p (len(p) >= HeaderSize). The state word is decoded
// too; callers that read a live mapping overwrite it with an atomic load.
func parseHeader(p []byte) Header {
	le := binary.LittleEndian
	var h Header
	copy(h.Magic[:], p[offMagic:offMagic+8])
	h.Version = le.Uint32(p[offVersion:])
	h.HeaderSize = le.Uint32(p[offHeaderSize:])
	h.Capacity = le.Uint64(p[offCapacity:])
	h.MaxRecord = le.Uint32(p[offMaxRecord:])
	h.Flags = le.Uint32(p[offFlags:])
	h.ProducerPID = le.Uint32(p[offProducerPID:])
	h.ProducerStartTime = le.Uint64(p[offProducerStart:])
	h.Epoch = le.Uint64(p[offEpoch:])
	h.WorkerID = le.Uint64(p[offWorkerID:])
	h.KVBlockSize = le.Uint32(p[offKVBlockSize:])
	h.MaxBufferSize = le.Uint32(p[offMaxBufferSize:])
	h.State = State(le.Uint32(p[offState:]))
	return h
}

// putHeader writes the static fields of h into p (the state word excluded: it is published with an atomic store).
func putHeader(p []byte, h *Header) {
	le := binary.LittleEndian
	copy(p[offMagic:offMagic+8], h.Magic[:])
	le.PutUint32(p[offVersion:], h.Version)
	le.PutUint32(p[offHeaderSize:], h.HeaderSize)
	le.PutUint64(p[offCapacity:], h.Capacity)
	le.PutUint32(p[offMaxRecord:], h.MaxRecord)
	le.PutUint32(p[offFlags:], h.Flags)
	le.PutUint32(p[offProducerPID:], h.ProducerPID)
	le.PutUint64(p[offProducerStart:], h.ProducerStartTime)
	le.PutUint64(p[offEpoch:], h.Epoch)
	le.PutUint64(p[offWorkerID:], h.WorkerID)
	le.PutUint32(p[offKVBlockSize:], h.KVBlockSize)
	le.PutUint32(p[offMaxBufferSize:], h.MaxBufferSize)
}

// validate checks the static fields against this build and the file size. The state is checked by the caller
// (Inspect accepts INIT, Open does not).
func (h *Header) validate(fileSize int64) error {
	if string(h.Magic[:]) != Magic {
		return fmt.Errorf("%w: got %q", ErrMagic, h.Magic[:])
	}
	if h.Version != Version {
		return fmt.Errorf("%w: file has version %d, this build reads version %d", ErrVersion, h.Version, Version)
	}
	if h.HeaderSize != HeaderSize {
		return fmt.Errorf("%w: header_size %d, want %d", ErrHeader, h.HeaderSize, HeaderSize)
	}
	c := h.Capacity
	if c < MinCapacity || c > MaxCapacity || c&(c-1) != 0 {
		return fmt.Errorf("%w: capacity %d is not a power of two in [%d, %d]", ErrHeader, c, MinCapacity, MaxCapacity)
	}
	if m := uint64(h.MaxRecord); m < MinMaxRecord || m > c/maxRecordDivisor || m%RecordAlign != 0 {
		return fmt.Errorf("%w: max_record %d not a multiple of %d in [%d, capacity/%d=%d]",
			ErrHeader, m, RecordAlign, MinMaxRecord, maxRecordDivisor, c/maxRecordDivisor)
	}
	if want := int64(HeaderSize) + int64(c); fileSize != want {
		return fmt.Errorf("%w: file is %d bytes, header says %d (4096 + capacity %d)", ErrHeader, fileSize, want, c)
	}
	if h.State > StateClosed {
		return fmt.Errorf("%w: unknown state %d", ErrHeader, uint32(h.State))
	}
	return nil
}

// checkPositions verifies head <= tail <= head+capacity with both multiples of RecordAlign.
func checkPositions(head, tail, capacity uint64) error {
	switch {
	case head%RecordAlign != 0:
		return corruptf(head, "head %d is not a multiple of %d", head, RecordAlign)
	case tail%RecordAlign != 0:
		return corruptf(head, "tail %d is not a multiple of %d", tail, RecordAlign)
	case tail < head:
		return corruptf(head, "tail %d is behind head %d", tail, head)
	case tail-head > capacity:
		return corruptf(head, "tail %d is more than capacity %d ahead of head %d", tail, capacity, head)
	}
	return nil
}

func align8(n uint64) uint64 { return (n + RecordAlign - 1) &^ (RecordAlign - 1) }
