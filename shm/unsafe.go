package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// This file holds every unsafe pointer conversion and every atomic access of kvshm.
//
// Soundness. The ring words live in a MAP_SHARED mapping (or, in tests and fuzzing, a heap slice of the same
// layout). word64 and word32 turn a bounds-checked &m[off] into a *uint64 / *uint32; that is sound because
// checkAtomicAlignment verified, once per mapping, that every such offset lies inside m and is naturally aligned
// (mmap returns page-aligned memory; the offsets are multiples of 8), so each access is one single-copy-atomic
// machine load or store that can neither tear nor fault on alignment. The mapping is never unmapped while a
// Reader or Writer method runs (they are owned by one goroutine and Close is the last call).
//
// Ordering. Go's sync/atomic operations are sequentially consistent, which is at least release for stores and
// acquire for loads; on amd64 they compile to plain MOVs (x86-TSO already orders them) plus a compiler barrier, on
// arm64 to STLR/LDAR. The other process (the Python producer) stores the tail through its C extension (XCHG on
// x86-64, STLR on aarch64; only on x86-64 without it, a plain store that TSO makes a release); see FORMAT.md. Each
// helper below names the edge it creates.

// word64 returns the 8-byte word at off. checkAtomicAlignment has proved off+8 <= len(m) and 8-byte alignment.
func word64(m []byte, off int) *uint64 {
	return (*uint64)(unsafe.Pointer(&m[off]))
}

// word32 returns the 4-byte word at off (the state word, consumer_parked, and the low half of the tail word, the
// futex of the doorbell). Same proof as word64, with 4-byte alignment.
func word32(m []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&m[off]))
}

// atomicOffsets64 lists every 8-byte word accessed atomically.
var atomicOffsets64 = [...]int{offTail, offHead, offDroppedEvents, offDroppedBytes, offLossFirstSeq,
	offLossLastSeq, offLossPending, offHeartbeat}

// checkAtomicAlignment verifies, once per mapping, that every atomic word is inside m and naturally aligned, and
// that this machine is little-endian (the native atomic words must match the little-endian file format).
func checkAtomicAlignment(m []byte) error {
	if !nativeLittleEndian {
		return ErrPlatform
	}
	if len(m) < HeaderSize {
		return fmt.Errorf("%w: mapping of %d bytes is smaller than the header", ErrHeader, len(m))
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	for _, off := range atomicOffsets64 {
		if (base+uintptr(off))%8 != 0 {
			return fmt.Errorf("kvshm/shm: atomic word at offset %#x is not 8-byte aligned", off)
		}
	}
	for _, off := range [...]int{offState, offParked} {
		if (base+uintptr(off))%4 != 0 {
			return fmt.Errorf("kvshm/shm: 4-byte atomic word at offset %#x is not 4-byte aligned", off)
		}
	}
	return nil
}

var nativeLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// storeTail publishes the producer's position (release). Every record byte (payload, then header) written into
// [old tail, t) happens before this store, so a consumer that loads t (loadTail) sees complete records. This is the
// ring's only commit: bytes past the tail are invisible whatever state they are in.
func storeTail(m []byte, t uint64) { atomic.StoreUint64(word64(m, offTail), t) }

// loadTail reads the producer's position (acquire), pairing with storeTail: the consumer's following plain reads
// of [head, t) see the bytes the producer wrote before publishing t. Never replace it with a plain load: the
// compiler could hoist it out of a polling loop.
func loadTail(m []byte) uint64 { return atomic.LoadUint64(word64(m, offTail)) }

// storeHead publishes the consumer's position (release). Every read the consumer made of bytes before h (including
// reads through Record.Payload) happens before this store, so the producer may overwrite them once it loads h.
func storeHead(m []byte, h uint64) { atomic.StoreUint64(word64(m, offHead), h) }

// loadHead reads the consumer's position (acquire), pairing with storeHead: the producer's following writes into
// bytes before h cannot be observed by the consumer's earlier reads. Also used at Open to resume (the consumer's
// own earlier store, possibly from a previous process).
func loadHead(m []byte) uint64 { return atomic.LoadUint64(word64(m, offHead)) }

// storeState publishes the life-cycle word (release). READY is stored after every static header field has been
// written, so a consumer that loads READY (loadState) sees the complete header. CLOSED is stored after the last
// tail store, so a consumer that loads CLOSED and then the tail sees the final tail.
func storeState(m []byte, s State) { atomic.StoreUint32(word32(m, offState), uint32(s)) }

// loadState reads the life-cycle word (acquire), pairing with storeState.
func loadState(m []byte) State { return State(atomic.LoadUint32(word32(m, offState))) }

// storeCounter writes one of the producer's loss-accounting words or the consumer's heartbeat. The words are
// gauges read one by one, so they need only single-copy atomicity; the one ordering the format promises is that
// loss_first_seq and loss_last_seq are stored before loss_pending=1 (release), so a reader that loads
// loss_pending=1 (loadCounter, acquire) sees the range of the pending loss.
func storeCounter(m []byte, off int, v uint64) { atomic.StoreUint64(word64(m, off), v) }

// loadCounter reads a loss-accounting word or the heartbeat (acquire); see storeCounter.
func loadCounter(m []byte, off int) uint64 { return atomic.LoadUint64(word64(m, off)) }

// storeParked writes consumer_parked (the consumer's doorbell flag). It is sequentially consistent: on amd64 an
// XCHG, a full fence, so the consumer's store parked=1 is globally visible before its following loadTail (the
// consumer half of the Dekker pair; see Reader.Park). On arm64 an STLR, which a later LDAR cannot pass.
func storeParked(m []byte, v uint32) { atomic.StoreUint32(word32(m, offParked), v) }

// loadParked reads consumer_parked. The Go Writer calls it right after storeTail, whose XCHG orders the tail store
// before this load (the producer half of the Dekker pair), so a Go producer never misses a parked consumer.
func loadParked(m []byte) uint32 { return atomic.LoadUint32(word32(m, offParked)) }

// tailFutex returns the address of the low 32 bits of the tail word (little-endian: the first 4 bytes at offTail),
// the futex word of the doorbell. It stays valid while the mapping is mapped; the kernel, not Go, dereferences it.
func tailFutex(m []byte) *uint32 { return word32(m, offTail) }

// uintptrOf is the address of a futex word, for tests that find it in /proc/self/task/*/syscall.
func uintptrOf(p *uint32) uintptr { return uintptr(unsafe.Pointer(p)) }
