// Package shm is kvshm's single-producer/single-consumer ring in shared memory: the byte layout, the Go Writer
// (Go producers, tests, benchmarks) and Reader (the daemon's drain loop), mapping, and record validation. Every
// unsafe conversion and every atomic access of kvshm lives in this package, in unsafe.go.
//
// # Design
//
// A ring is a regular file (by default in /dev/shm, see DefaultDir) of 4096 + capacity bytes, mapped MAP_SHARED
// by both processes: a header page, then a power-of-two data area. The producer (usually the Python package's
// RingWriter, else Writer) appends records at the tail; the consumer (Reader) reads them from the head. head and
// tail are ever-increasing u64 byte positions (index = pos & (capacity-1)) on separate 128-byte slots, with
// head <= tail <= head+capacity, both multiples of 8. We chose a named file over a memfd passed on the socket:
// the daemon can reattach to it after a restart (the head is persisted in the file), `kvshmd inspect` can read it,
// and ownership and mode checks are ordinary file checks. FORMAT.md is the byte-level specification.
//
//	file offset 0                       4096                                       4096+capacity
//	+----------------------------------+-----------------------------------------------+
//	| header page                      | data area: records at 8-aligned indexes       |
//	+----------------------------------+-----------------------------------------------+
//	0x000 magic "KVSHMRG\0", version,      [ rec | rec | ... | rec | PADDING ] [ free ]
//	      capacity, max_record, identity      ^ head & mask            ^ tail & mask
//	0x048 state   INIT / READY / CLOSED
//	0x080 tail    producer: the commit word  record: [u32 length][u32 type][payload][pad to 8]
//	0x100 head    consumer: persisted        length = 8 + len(payload) <= max_record
//	0x180 loss accounting (producer)         types: EVENT 1, LOSS 2, BATCH 3, PADDING 0xFFFFFFFF
//	0x200 consumer heartbeat, 0x208 consumer_parked (doorbell)
//
// Publication: the producer writes a record's payload, then its header, then stores the tail. The tail is the only
// commit word, so whatever lies past it (a half-written record of a producer that died) is invisible. One tail
// store may publish many records (Append several times, then Publish). The Go side uses atomic.StoreUint64 /
// LoadUint64 (release / acquire: STLR / LDAR on arm64); the Python writer stores it through its C extension
// (kvshm._ringsync: XCHG on x86-64, STLR on aarch64), or, only on x86-64 without it, with one aligned 8-byte store,
// a release under x86-TSO. FORMAT.md argues both memory models; the layout does not depend on the page size
// (4 or 64 KiB: the file is mapped whole, never madvised in parts). A record never straddles the end of the
// data area: a PADDING record fills the rest and the record starts at index 0; the free-space check includes the
// padding.
//
// Full ring: the producer never blocks. WriteEvent returns ErrFull at once, writes nothing, and counts the drop in
// the header (dropped_events, dropped_bytes, loss_first_seq/loss_last_seq with loss_pending=1). The next event
// that fits is preceded, in the same publication, by a LOSS record {first_seq, last_seq, count} naming exactly the
// dropped seqs; then loss_pending returns to 0. An event larger than max_record is dropped and counted the same way
// (ErrTooLarge).
//
// Batches: a BATCH record (type 3) carries one engine batch atomically (the consumer never sees half of one): the
// engine's timestamp, then sub-records laid out like ring records, EVENT (1, a kvevent.Event FlatBuffer) and META
// (4, a kvevent.Meta for the EVENT right after it). Record.Batch parses and validates the layout (ErrMalformedBatch
// on any violation: the consumer counts the record and skips it); the FlatBuffers stay opaque here, so checking
// that the EVENTs share one seq and dp_rank is the consumer's job. Writer.WriteBatch writes one; a batch that does
// not fit is refused whole (the caller counts the loss of its seq with CountDrop). A producer writes BATCH records
// only to a consumer that said it reads them (kvshmd's ATTACH reply "batches": true): an older Reader reports type 3
// as corruption. FORMAT.md, "BATCH record", is the byte layout.
//
// Doorbell: a consumer with nothing to read can sleep in Reader.Park instead of polling. Park stores
// consumer_parked = 1 (0x208), re-checks the tail, and sleeps in FUTEX_WAIT (shared, not private: the producer is
// another process) on the low 32 bits of the tail word, with a timeout; Reader.Wake, from any goroutine, interrupts
// it. After each tail store a producer loads consumer_parked and, only when it is set, calls FUTEX_WAKE on the tail
// word (Writer.Publish; the Python writer likewise through its extension). No wakeup is lost between the Go Reader
// and a Go Writer or the Python writer's extension: each side's store is ordered before its load (XCHG on amd64,
// STLR then LDAR on arm64); the x86-64 pure-Python fallback cannot fence between its tail store and its load of the
// flag, so its wakeup can be lost, and the Park timeout bounds that delay. FORMAT.md, "Doorbell", has the argument.
// A consumer of many rings arms each (Reader.Arm: Park's first half, the flag then the tail reload) and sleeps on
// all of them at once with Doorbells.Wait (futex_waitv, Linux >= 5.16: up to MaxDoorbells rings plus a private
// wake word that Doorbells.Wake rings); producers cannot tell the difference. Without futex_waitv Wait returns
// ErrNoWaitv and the consumer falls back to Park per ring.
//
// Identity: the header names the producer by pid and start time (field 22 of /proc/<pid>/stat), so a recycled pid is
// not taken for the producer. ReadProcStat is the one parser of that file in Go (the daemon uses it for its pid
// checks; Python's is kvshm._proc.proc_stat).
//
// # Usage
//
//	w, err := shm.Create(path, shm.Options{Capacity: 16 << 20, WorkerID: 1})  // producer
//	err = w.WriteEvent(seq, payload)                                          // ErrFull/ErrTooLarge: counted drop
//
//	r, err := shm.Open(path)                                                  // consumer
//	for {
//		rec, err := r.Next()
//		if errors.Is(err, shm.ErrEmpty) { r.Release(); r.Park(250 * time.Millisecond); continue } // or back off
//		var ce *shm.CorruptionError
//		if errors.As(err, &ce) { r.SkipToTail(); /* mark history unknown */ continue }
//		handle(rec) // rec.Payload aliases the ring
//	}
//
// Open validates the header (magic, version, sizes, state, head/tail invariants) and resumes at the persisted
// head. Inspect reads the header page of a ring without mapping or locking it (for `kvshmd inspect`). Heartbeat
// lets the consumer publish when it last drained (informational). DefaultDir is /dev/shm when it exists.
//
// # Concurrency
//
// A Writer and a Reader are each owned by one goroutine, except Reader.Wake, which any goroutine may call at any
// time (also after Close). The two sides synchronize only through the tail (release store by the producer, acquire
// load by the consumer) and the head (the converse); consumer_parked and the futex only decide when the consumer
// looks again, never what it may read. There must be one
// producer per ring (enforced with flock by Create and by the Python writer) and one consumer (not enforced).
//
// # Failure outcomes
//
//   - Producer dies mid-write: the partial record lies past the tail and is never read.
//   - Ring full, or record too large: the call returns at once; the drop is counted in the header and reported by a
//     LOSS record before the next event.
//   - Corrupt record or position word: Next returns a *CorruptionError{Pos, Reason} (errors.Is ErrCorrupt) without
//     reading outside the mapping; it repeats until the consumer calls SkipToTail, which drops the unread bytes.
//     The consumer must then treat its state as unknown history. SkipToTail never moves head to a tail word no
//     producer can have stored (misaligned, behind head, more than capacity ahead): it stays until the producer's
//     next publish rewrites the word. A corrupt word within capacity ahead cannot be told from a real tail; when
//     the producer later finds the consumer's head ahead of its own tail (by at most a ring, aligned) it re-bases
//     there, dropping and reporting one event, so a scribbled tail word costs at most a ring of events, never the
//     stream.
//   - Malformed BATCH payload: Record.Batch returns an error wrapping ErrMalformedBatch (Next returned the record:
//     its header was valid), so only that record is lost; the ring stays in step.
//   - Magic or version mismatch, invalid header fields or file size: Open refuses with ErrMagic, ErrVersion
//     (naming both versions) or ErrHeader.
//   - Second producer on the same file: Create refuses with ErrLocked (ErrExist for a stale file nobody holds).
//   - File system full (tmpfs): Create refuses with ErrNoSpace; the file is preallocated, so no SIGBUS later.
//   - A lost doorbell (the x86-64 pure-Python fallback, see above): the parked consumer reaches the record when Park
//     times out.
//     A consumer that died parked leaves consumer_parked = 1 (one futex call per publication) until Open resets it.
//
// # Caveats
//
// Record.Payload aliases the mapping. It stays valid until the next Release (or SkipToTail): after that the
// producer may overwrite it at any moment. Copy what you keep (for example map keys) before Release. Never touch a
// payload after Close: the memory is unmapped and the access faults. A producer that truncates the ring file can
// make the consumer fault with SIGBUS; the daemon only maps files owned by the attaching user.
//
// Go cannot fork without exec, so a Writer cannot be inherited by a child process (the Python writer checks its
// pid before each publish instead). Writer does not re-check the pid: os.Getpid is a system call.
package shm
