// Package stream is kvshmd's stream engine: a stream per producer key (worker, scope) owning an index that outlives
// producers, the attachment of a producer's ring to it, and the drain that applies the ring's records to the index
// and publishes them on ZMQ: losses, producer incarnations, wire seqs, heartbeats, replay snapshots and continuous
// checkpoints. Package daemon is the front end around it (the socket protocol, HTTP and rank ports, ATTACH's
// validation and outcome table, checkpoint files, metrics, the reaper) and calls it; daemon/doc.go is that
// contract.
//
// # Usage contract
//
//	eng := stream.New(cfg, env, sched, log)   // once per daemon
//	pub, err := eng.OpenPublisher(key, p)     // a stream that will publish (p nil: none)
//	st := eng.NewStream(key, ix, pub, p)      // or, for a new ring epoch: st.Restart(ix, epoch)
//	a, att, err := st.Attach(stream.AttachSpec{Ring: r, Header: h, Start: stream.StartBegin, ...})
//	err = a.Sync(ctx)                         // read-your-writes before a query of st's index
//	a.Finish(stream.CauseDetach, "detach requested"); <-a.Done()
//
// The daemon decides which steps an ATTACH takes (its outcome table: first attach, restore, reattach, restart);
// the engine decides how the stream's incarnation and wire counter start (planStart, pure: TestPlanStart) and
// carries them out under the stream's lock (Stream.Attach). The scripts in testdata/ (TestScripts) walk streams
// through their lives this way, with no socket: attach, apply, drain, lose, detach, restart, and the state, the
// recovery answers and the replayed batches at each step.
//
// # The environment
//
// What the engine needs from around it is two things. Config is constant for the daemon's life (the heartbeat
// period, eager drain, the pid check period, the checkpoint interval, replay fill and snapshots, rank ports). Env
// is what the engine cannot decide itself: the wall clock wire seqs start from, the reaper's clock and wakeup
// (StreamIdle), whether the --parent-pid is gone, the producer's pid (the backstop's PIDWatch, and ProcessAlive for
// watch-detached, which stops on Done), a dp_rank's first event (RankSeen: --rank-ports) and the checkpoint files
// (Checkpoints). Env is an interface, not a struct of funcs: every method is needed, so a missing one is a compile
// error rather than a nil call on a drain worker; the daemon implements it in one small adapter (daemon/env.go),
// the scripts here with a fake clock, pids they kill and checkpoints in memory. Scheduler (drain.Scheduler in the
// daemon) runs the attachments; the scripts run them by hand, so every pass is deterministic.
//
// # Concurrency
//
// Every attached ring is owned by one drain worker of the scheduler (package drain: a small pool of workers
// serving all rings; "the drain goroutine" below is the worker that owns the attachment, one at a time, from
// Attach until its end). It is the only goroutine that touches the ring's shm.Reader, except for the two header
// words Sync's fast path loads under the attachment's mapMu, and the only writer of its index; any number of
// concurrent readers of an index. The wire counter and the incarnation state belong to the current attachment's
// drain goroutine, or to the holder of the stream's mutex while no attachment is installed (incarnation.go).
// Stream and Attachment methods are safe for concurrent use.
//
// # Streams and their lifecycle
//
// Ending an attachment always drains the ring one last time (up to the tail seen at the stop), releases the head
// (with --checkpoint-interval after writing a checkpoint of it) and unmaps the ring; the head persisted in the ring
// is where a later daemon resumes.
//
// Incarnations (docs/lifecycle.md is the contract; incarnation.go, Start): an incarnation is one producer's life on a stream. It
// begins at the first attach of a ring epoch the stream has not followed (a first attach at head 0 too: the ring
// then holds the whole incarnation), or at a reattach of an epoch whose incarnation was seen to end; a first attach
// at head > 0 (a daemon restart) continues it. It ends, after the final drain and before the final checkpoint, on
// DETACH, a pid gone, a ring state CLOSED seen when the connection closes, a new ring epoch (which ends the previous
// one first, at its attach), or the exit of a daemon whose --parent-pid is gone (a private daemon's engine is its
// parent); a daemon shutdown otherwise (SIGTERM) ends none: the producer reattaches the same epoch. At the end the
// stream's index applies a Cleared (every stream, published or not: /kv_recover never holds a dead engine's
// blocks), under the next wire seq on a publishing stream, else under the id after the index's last (the engine's
// numbering). A publishing stream also publishes the Cleared at the end and at the start ("Publishing on ZMQ").
//
// # Drain loop
//
// Per pass: the ring header's loss gauge is loaded, then up to 256 records via Reader.Next, read in place; EVENT →
// fbs.Decode (zero-copy) → index ApplyStoredTokens (the index hashes the token bytes in place) or Apply; LOSS →
// index.MarkLost(first, last) (see "Losses");
// then one Release (one head store) per pass (with --checkpoint-interval only after a checkpoint), one update of the per-stream counters (events and blocks received,
// blocks applied by the event's tree status) and a ring-stats snapshot. A panic while decoding or applying one
// record (a bug in fbs or index) is recovered (one deferred recover per pass, not per record: BenchmarkDrainBatch
// measured no difference): the record is skipped, counted as malformed, logged with its stack, the index is marked
// unknown-history, and the pass continues with the next record.
// Idle strategy (package drain, drain/doc.go; the periods in idle.go): a worker sleeps in one futex_waitv on the
// doorbells of all its rings (shm.Doorbells: each ring armed as Reader.Park arms it, so producers are unchanged)
// plus a private wake word; the producer's next publish, a query barrier (Attachment.Sync wakes the worker at
// once), a stop or the earliest housekeeping deadline wakes it, and it then drains every ring of its set that has
// records. It polls instead of sleeping only while some ring's records come faster than a wakeup costs. The
// housekeeping (Attachment.Housekeep: heartbeat, ring snapshot, truncation and CLOSED checks, the pid backstop
// through a pidfd, a continuous checkpoint whose interval passed without records) is due every 10 ms on a
// publishing stream and every second otherwise; the worker coalesces the deadlines of its streams into one
// wakeup. The period also bounds a doorbell the Python producer loses (it cannot fence; see shm/FORMAT.md,
// "Doorbell"): such a record waits at most until the next deadline. Without futex_waitv (Linux < 5.16, or
// Config.Drain.NoWaitv) each ring gets a worker of its own that waits with Reader.Park. What it costs is measured by
// BenchmarkDaemonIdleCPU, BenchmarkDaemonStreamsCPU and BenchmarkDaemonQueryUnderLoad (bench/RESULTS.md).
//
// Lazy streams (idle.go, lazyLevelMax): a stream that is not published is read only by queries, whose barriers
// wake the worker themselves, so its producer rings only when 64 KiB (at most a quarter of the ring) are unread
// (a doorbell level: shm.Reader.SetDoorbellLevel, shm/FORMAT.md "Doorbell"); below that its records wait for the
// worker's next wakeup, at the latest its deadline (1 s). A wakeup, not the work, is what such a stream costs
// (BenchmarkDaemonProcCPU).
//
// # Losses
//
// A loss is marked on the index (LOSS records, the ring header's pending range below, a corrupt ring record or a
// malformed event: unknown history), which answers by the daemon's --on-loss policy; daemon/doc.go ("Losses") says
// how an answer reports it. An id gap without a LOSS record is not a loss (counted only, by the index).
//
// A loss the producer has counted but not yet reported: a producer that finds the ring full counts the
// drop in the ring header (loss_pending, loss_first_seq..loss_last_seq) and writes the LOSS record only with its
// next event that fits; an engine that goes idle never writes it. So a drain pass that finds the ring empty marks
// the header's pending range lost itself (the header is loaded before the pass and the tail by the pass's last
// Next, so every event published before the drops is applied), and a query barrier also waits until the episode
// the header showed when the query arrived is marked: a loss known before a query is in its answer. The LOSS
// record that comes later for the same episode (same first seq) adds only ids beyond what was marked, so a loss is
// counted once. The header's fields are gauges loaded one by one: a read torn across two episodes is recognised
// (a pending episode starts after the last id applied) and ignored; the LOSS record stays authoritative.
//
// A Stored event whose token count is not blocks × block_size is hashed and applied as Dynamo does (complete
// windows, zipped with the block hashes), never refused: counted (STATS token_mismatches,
// kvshm_token_count_mismatch_total) and logged, one warn line per stream per 10 s.
//
// # Continuous checkpoints (--checkpoint-interval D, requires --state-dir)
//
// A crash loses nothing either (a planned restart with --state-dir loses nothing: daemon/doc.go, "Checkpoints"). The drain
// goroutine applies records as always, but does not release the ring head after each pass: it releases only after
// a checkpoint whose recorded head is exactly the position it releases has been durably written (Env's
// Checkpoints: temporary file, fsync, rename, directory fsync). So at
// every moment the head persisted in the ring is at or behind the head recorded in the newest checkpoint file
// (behind between the rename and the release: restore then moves the reader forward, daemon/doc.go
// "Streams and their lifecycle"), and the
// ring still holds every record since. After a SIGKILL or OOM the next daemon restores that checkpoint (the head matches)
// and replays the ring from there: restored true, not tainted. A checkpoint is written, between two drain passes:
//
//	D has passed since the last one and the records applied since    trigger "interval" (an idle stream writes none;
//	reach 16 bytes per live node of the index (ckptBytesPerNode)      a stream with only a probe now and then, rarely)
//	the applied-but-unreleased bytes exceed half the ring's capacity  trigger "half-ring", so under normal load the
//	                                                                  producer never finds the ring full because of it
//	a corrupt record made the drain skip to the tail (which released) trigger "corruption": the file matches the head
//	                                                                  again (its index is the tainted one, honestly)
//	the attachment ends (EOF, DETACH, CLOSED, shutdown)               trigger "final"; Shutdown then writes none itself
//
// The "interval" and "half-ring" checkpoints are asynchronous (ckptasync.go): between two passes, where the index
// holds exactly the records before the read position P, the drain goroutine takes index.CheckpointCopy (under the
// index's read lock: ~14 ms per 100k resident blocks, a third of the encoding) and notes P; a writer goroutine of
// the attachment encodes the copy and writes, fsyncs and renames the file while the drain goroutine goes on applying
// and publishing; when the write has finished, the drain goroutine (the Reader's owner) releases the head to exactly
// P with shm.Reader.ReleaseTo on its next pass (the writer wakes it). At most one is in flight per stream: a
// checkpoint due meanwhile waits until it finishes, and so does the half-ring trigger; if the ring fills meanwhile
// the producer drops events, counted and reported as always. The "final" and "corruption" checkpoints and a ring
// fault first wait for the one in flight (so files are renamed in the order of their heads and no write outlives
// the attachment), and "final" and "corruption" are written on the drain goroutine, which then releases the read
// position. So applying pauses only for the copy, and a query's read-your-writes barrier does not wait for the
// write. Barriers and the final drain measure progress by
// the read position (applied), not the released head; STATS' ring head is the released one, so it lags the applied
// records by up to half the ring.
//
// A restored checkpoint is kept (it stays valid until a newer one replaces it, which happens before the head moves),
// so a second crash before the next checkpoint restores it again. A failed write (disk full, I/O error) is logged
// and counted (kvshm_checkpoint_writes_total{result="failed"}), the worker's checkpoints are deleted, and the head is
// released anyway, so the producer never stalls on the disk: a crash before the next good checkpoint then reports
// unknown history, honestly, instead of restoring an index without the released records (the head check at restore
// refuses such a file too). A crash while a file is written leaves a temporary file (removed at the next Listen) and
// the previous checkpoint, whose head is still the ring's: it is restored and the ring replayed.
//
// The price is ring capacity: up to half of each ring (plus what the producer publishes during a write) holds
// records that are applied but not released, so the ring absorbs a stopped or restarting daemon for only the rest
// of it before the producer drops events (counted, reported as lost ids). Size rings for twice the outage you want
// to absorb. The disk cost is one checkpoint write per stream per D while events flow, plus one per half ring.
//
// # Publishing on ZMQ
//
// A producer may ask, in its ATTACH (sock.AttachRequest.Publish), that kvshmd publish the stream on ZMQ in vLLM's
// KV-event wire format (package vllmwire; sockets in package zmqpub). The publisher belongs to the stream, not to
// the attachment: a re-attach with the same publish config keeps it (subscribers stay connected, the replay buffer
// is kept), another config closes it and binds anew, an ATTACH without publish closes it; FORGET and shutdown (after
// the final drain) close it. A bind failure is ErrPublish (the daemon's bad_request: nothing is attached).
//
// The drain goroutine handles the records:
//
//	EVENT record   applied as without publishing; published as a one-event batch [now, [event], dp_rank] with seq = its id,
//	               medium "GPU", lora_id None, block_size = the stream's kv_block_size
//	BATCH record   validated whole first (shm.Record.ParseBatch, every FlatBuffer and Meta, one seq and dp_rank);
//	               then each event's Meta (if any) decides whether it is indexed (below); the indexed ones are
//	               applied after index.Indexer.BeginBatch(seq), so they share the batch's id; every event, indexed
//	               or not, is published in order as one batch [ts or now, [events], dp_rank] with seq = the id
//	               (ts 0 from the producer means unknown: the daemon's clock)
//
// The index gets an event only if Dynamo's worker side would put it in the device tree (the device-tree
// filter, docs/decisions.md, following Dynamo 1.6.1's zmq_wire normalizer; indexfilter.go): a Meta medium other than "GPU" (reason medium), a
// kv_cache_spec_kind that is not main attention (full_attention, mla_attention, sink_full_attention;
// kv_cache_spec_kind), a group_idx other than 0 not learned as main attention, or learned as not
// (group_idx: a Stored event carrying both group_idx and kind teaches the kind of (dp_rank, group), as Dynamo
// learns it), or a block_size other than the stream's (block_size) keep it out; each is counted
// kvshm_events_not_indexed_total{reason}. Cleared and events without Meta are always indexed. A batch of which
// nothing is indexed leaves an id gap in the index (not a loss).
//
// The payloads follow the vLLM release the ATTACH names (sock.Publish.Wire: "0.33", the default, "0.32" or "0.31";
// see vllmwire, "Releases"), per attachment: a re-attach may change it and keeps the publisher; an unknown name is
// bad_request. A Meta may carry its event's bytes block hashes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0):
// they are published as msgpack bin, as vLLM does, while the index applies the EVENT's keys (vllmwire.HashKey); a
// Meta whose bytes are not those keys (checkHashBytes) makes its batch malformed (skipped whole, counted).
//
// Publishing never slows ingest: the drain worker encodes the payload into a reused buffer, copies it once, and
// hands it to the publisher, which never blocks (a non-blocking write to each subscriber that keeps up, the rest
// queued for that subscriber's writer); zmqpub/doc.go says what a slow subscriber or replay client costs (only
// itself). Publish fails only after the publisher is closed (counted closed).
//
// Wire seqs are kvshmd's, not the engine's (docs/lifecycle.md, "Wire seqs"): one counter per publishing stream
// (Stream.wire), +1 per published batch, continued at max(last + 1, Env.Now in µs) when this daemon starts
// the stream (or starts publishing it, or restores its checkpoint: never below the restored index's last id) and
// when an incarnation begins. The drain goroutine gives each EVENT or BATCH record the next seq before applying
// it, and the index logs the record's events under it (BeginBatch(seq)), so /kv_recover, EVENTS and kvshmd events
// speak wire seqs on a publishing stream. A malformed record takes none. A LOSS record (or a pending loss read
// from the header) takes one wire seq per lost engine seq, never published, and the index marks exactly those
// lost (at most 2^24 per record; beyond that the history is marked unknown). Engine seq gaps without a LOSS record
// take none. A stream that is not published keeps the engine's ids.
//
// Incarnation batches: at the start of an incarnation (see "Streams and their lifecycle") a publishing stream
// publishes [now, [AllBlocksCleared], dp_rank] with the incarnation's first wire seq through
// zmqpub.Publisher.PublishReset (the replay buffer then starts with it, so a replay from any older seq yields
// exactly the new incarnation) and applies it to the index; at the end the same batch with the next wire seq, also
// a reset. dp_rank is that of the stream's last published batch (a per-rank stream's rank before any).
//
// Heartbeats (--zmq-heartbeat, Config.Heartbeat): a publishing stream that handed
// nothing to its publisher for that long publishes [now, [], dp_rank] with the next wire seq through
// PublishHeartbeat (live only, not in the replay buffer, not in the index: an id gap there). It is checked on the
// stream's housekeeping (due every 10 ms on a publishing stream, coalesced with the other streams of its worker).
//
// Replay snapshots (snapshot.go; docs/replay-snapshots.md; default on, --zmq-snapshots=false off): a publishing stream's index
// keeps token windows (index.Config.KeepTokens; an index made for an ATTACH without publish gets EnableTokens when
// publishing starts), and its publisher gets a Snapshotter: a replay the buffer cannot answer completely gets, per
// dp_rank the stream has carried, [now, [AllBlocksCleared, BlockStored...], rank] under seq L = the index's last id
// (the wire seq of the last whole batch: the drain goroutine holds stream.snap across each BATCH's apply and the
// tree copy takes it too, so the copy never falls inside a batch; the drain waits at most for the copy, ~8 ms at
// 100 k blocks), then the buffered batches after L. Builds run in the asking client's reply goroutine, at most
// --zmq-snapshot-builds at once daemon-wide (Config.SnapshotLimit; more wait for a slot), one per stream at
// a time, shared while the buffer covers their tail; kvshm_zmq_snapshots_total{outcome} counts them. Checkpoints
// carry the token windows (index format 3), so a daemon restarted from its state dir answers the same snapshot. A
// block whose tokens are unknown (restored from a version 2 checkpoint, or stored before publishing started)
// makes the snapshot unavailable until a Cleared: the reply is the buffer's, counted incomplete. The snapshot also
// comes without its Cleareds (zmqpub.Snapshot.Fresh) for a reply from seq 0, whose consumer holds nothing.
//
// Contiguous replies (--zmq-replay-fill, Config.ReplayFill): the publisher's
// filler is the heartbeat batch (emptyBatch), so a reply carries every seq from the requested one (docs/replay-snapshots.md).
// --zmq-seq-base zero (Config.SeqZero) makes wireFloor 0: seqs from 1, for llm-d's consumer, which replays from
// seq 0 (docs/lifecycle.md).
//
// A restarted daemon replays only what it has published since it started (the replay buffer is in memory), and
// batches in the ring that it drains again after an unclean stop (from the persisted head) are published again
// under new seqs: re-applying a suffix of the log leaves a router's state unchanged. With a restored checkpoint the
// records before the checkpoint's head are not published again. At shutdown, after every final drain, each
// publisher is flushed (zmqpub.Publisher.Flush, at most 1 s for all streams together) before it is closed.
//
// # Caveats
//
// Record payloads alias the ring mapping and are valid only until the drain goroutine's next Release: nothing
// in this engine keeps them (the index copies what it stores). The streams of one drain worker share its
// goroutine: a continuous checkpoint of a large index (~0.2 s per million blocks) delays the worker's other
// streams too (drain/doc.go, "Caveats"). An idle worker's wakeup costs the Go runtime's sysmon some polling (it
// retakes the P a worker's futex_waitv held): that, not the drain work, is most of the idle and the 10 events/s
// figures (perf).
// With --checkpoint-interval a ring holds up to half its capacity of applied-but-unreleased records (see
// "Continuous checkpoints"), and applying pauses while a checkpoint is written.
package stream
