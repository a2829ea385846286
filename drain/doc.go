// Package drain is kvshmd's drain scheduler: a small pool of workers that follow every attached ring, instead of
// one OS thread per ring. A worker sleeps until one of its rings is published to (the ring's futex doorbell,
// shm/FORMAT.md "Doorbell"), a stream asks for attention (a query barrier, a stop) or a housekeeping deadline
// comes; then it drains every ring of its set that has records (batching across streams), runs the deadlines
// that are due, and sleeps again. One wakeup per record burst, not a spin per stream.
//
// # Usage contract
//
//	s := drain.New(drain.Config{})           // workers start lazily
//	h := s.Add(stream)                        // stream implements drain.Stream; a worker owns it from here on
//	h.Wake()                                  // from any goroutine: run a pass soon (a query barrier)
//	h.Stop()                                  // from any goroutine: the worker calls stream.Final, then drops it
//	s.Close()                                 // after every stream has ended; waits for the workers
//
// # Design
//
// Waiting. On Linux >= 5.16 a worker waits with futex_waitv (shm.Doorbells) on the tail words of its armed rings
// (up to shm.MaxDoorbells) plus one private wake word of its own. Arming a ring is exactly Reader.Park's half of
// the doorbell protocol (consumer_parked = 1, then reload the tail), so producers (the Go Writer and the Python
// RingWriter) are unchanged: their next publish sees consumer_parked and calls FUTEX_WAKE on the tail word, which
// wakes the worker's futex_waitv. A ring stays armed while the worker sleeps and across wakeups caused by other
// rings (no store per wakeup); it is disarmed (consumer_parked = 0) when it is drained, so a producer pays a
// FUTEX_WAKE only while its consumer may be asleep. Handle.Wake and Handle.Stop store a flag and then ring the
// worker's private word (shm.Doorbells.Wake: a system call only while the worker sleeps).
//
// Park first, poll only when it is cheaper. After a pass that found records the worker polls again at once; when
// a stream's ring is empty the worker arms it, unless the stream is hot: its measured gap between record bursts
// (an EWMA) is shorter than a wakeup costs (hotGap). While some stream of the worker is hot and its last burst is
// younger than twice its gap (at most spinMax), the worker polls (yielding the P between polls) instead of
// sleeping. A producer publishing faster than a wakeup therefore never rings; one publishing slower costs one
// wakeup per burst, and the daemon never naps on a timer.
//
// Housekeeping by deadline. Each stream's Housekeep returns when it next needs the worker without records
// (heartbeats of a publishing stream, the lost-doorbell bound, ring statistics and the truncation check, the pid
// backstop, continuous checkpoints). The worker sleeps until the earliest deadline of its streams; when it wakes it
// also runs every deadline within a quarter of its period, so the deadlines of many idle streams coalesce into one
// wakeup (a stream's Housekeep then runs its checks due within that slack too, so they follow the worker's ticks).
// The deadlines are found by a linear walk, not a heap: every wakeup already visits every stream of the worker
// (at most shm.MaxDoorbells) to poll its ring. An idle stream needs no wakeup for anything else.
//
// Doorbell levels. A stream may set its ring's doorbell level (shm.Reader.SetDoorbellLevel) above one record:
// Arm then leaves the ring armed with unread records below the level, and its producer rings only at the level.
// The worker needs no rule for it: every wakeup polls every ring, so such records are drained at the worker's next
// wakeup for any reason (another ring, a Wake, a deadline), and the stream's deadline bounds their wait.
//
// Lost doorbells. The Python producer cannot fence between its tail store and its load of consumer_parked, so a
// doorbell can be lost exactly when a ring is armed. Every wakeup of a worker polls every ring it holds, and each
// stream's deadline (its Housekeep's answer: 10 ms for a publishing stream, 1 s otherwise in kvshmd) bounds how
// long a lost doorbell can delay a record; the bound is TestLostDoorbellBounded's.
//
// Fallback. When futex_waitv is missing (ENOSYS, kernels before 5.16) or Config.NoWaitv is set, every stream gets
// a worker of its own that waits with Reader.Park (or Reader.Nap when its ring is not armed) and is woken by
// Reader.Wake: the same loop with a set of one ring, one goroutine per ring (not locked to a thread, never spinning
// on a timer). Tests force it with Config.NoWaitv.
//
// # Invariants
//
//   - A stream is owned by exactly one worker from Add until Final or Fault returns: every Stream method runs on
//     that worker's goroutine, one at a time. Handle.Wake and Handle.Stop only store flags and ring.
//   - Stop is final: after Handle.Stop the worker calls Final exactly once (unless a fault came first: then Fault,
//     exactly once), never Pass again, and forgets the stream.
//   - Memory faults are contained per stream: a worker runs with debug.SetPanicOnFault, and a memory fault in any
//     call into a stream (a ring file truncated under the daemon) is recovered, handed to that stream's Fault, and
//     only that stream is dropped (its ring is not touched again: not disarmed, not drained). A futex_waitv that
//     fails with EFAULT (an armed ring's header page is gone) makes the worker check every ring's file size and
//     fault the truncated ones. Any other panic is not recovered here (the Stream contains its own).
//   - A wakeup is never lost between a flag store and the worker's sleep: Doorbells.Wait sleeps only while the wake
//     word still holds the value the worker saw when it last woke (an eventcount), and a ring is armed (flag,
//     then tail reload) before the worker sleeps on its tail value.
//   - A worker never holds more than shm.MaxDoorbells rings; Add starts another worker when all are full.
//
// # Failure outcomes
//
//	futex_waitv ENOSYS                        fallback: one worker per stream on Reader.Park (above)
//	futex_waitv EFAULT (a ring truncated)     every ring's size checked; the truncated ones get Fault
//	memory fault in a Stream call             that stream's Fault; the worker and its other streams go on
//	a Stream's Housekeep reports an error     that stream's Fault (the error is the cause)
//	a lost doorbell (Python producer)         the record waits at most until the stream's next deadline
//
// # Caveats
//
// Streams of one worker share its goroutine: a slow call delays the other streams of that worker by as long, where
// one goroutine per ring delayed only its own. A continuous checkpoint's file write no longer runs there
// (daemon/internal/stream/doc.go, "Continuous checkpoints"); its index copy does (~0.15 s per million blocks), and so do the synchronous
// final and corruption checkpoints. Query barriers wait for them as before.
//
// A worker sleeps in a system call, so the Go runtime counts its P as busy until sysmon retakes it (after 10 ms when
// other Ps are idle); sysmon cannot sleep deeply meanwhile and polls at 20 µs for a millisecond after each retake.
// That polling, not the drain work, is most of what an idle or slowly publishing daemon costs (perf: ~25% of the
// daemon's CPU at 64 streams × 10 events/s). Sleeping in the netpoller instead (io_uring's FUTEX_WAITV completing
// into an eventfd) would avoid it; not done.
//
// Worker size: each sleep re-queues every armed ring of the worker in the kernel (~0.27 µs each), and every wakeup
// polls all of them, so DefaultRingsPerWorker (16) trades batching across streams for a cheaper wakeup: with 64
// streams at 10 events/s, 16 per worker cost 5.8% of a core and 64 per worker 9.5% (BenchmarkDaemonStreamsCPU,
// KVSHM_BENCH_RINGS_PER_WORKER); idle, both cost the same.
package drain
