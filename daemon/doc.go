// Package daemon is kvshmd: it follows the shared-memory rings of KV-cache event producers (one stream per
// producer, keyed by worker and scope), applies their events to a per-stream index, and answers recovery, stats and
// match queries over a Unix socket and, optionally, HTTP. cmd/kvshmd wraps it in a CLI.
//
// # Usage contract
//
//	srv, err := daemon.New(daemon.Config{SocketPath: p, HTTPAddr: "127.0.0.1:9400"})
//	err = srv.Listen()         // binds; clients can connect from here on
//	err = srv.Serve(ctx)       // until ctx ends or --parent-pid dies; drains every ring, returns nil
//
// A producer creates its ring (package shm), connects, sends ATTACH and keeps that connection open for its whole
// life: EOF on it is how the daemon learns the producer is gone (a periodic check of the ring header's
// producer_pid is the backstop). Queries go on other connections (sock.Client). Every query on a stream first waits
// until the drain goroutine has applied everything published before the query arrived (read-your-writes). When the
// producer's tail word already equals the position the drain goroutine last applied up to, and the ring header
// reports no pending loss, there is nothing to wait for and the query answers at once (no round trip to the drain
// goroutine, which may be asleep: ~25 µs instead of ~60 µs for a TooNew through LocalIndexer); otherwise it hands
// the drain goroutine a barrier and wakes it.
//
// Concurrency: one goroutine per connection; every attached ring is drained by the stream engine (package
// daemon/internal/stream, whose doc.go is the contract of the drain goroutine, what it owns and what a query may
// read). Server methods are safe for concurrent use.
//
// # Streams and their lifecycle
//
// A stream is keyed by (worker_id, scope) and owns an index (created with the ring's kv_block_size and
// max_buffer_size and the daemon's --on-loss and --dump-shape) that outlives producers; at most one attachment (a
// ring plus its drain goroutine) feeds it at a time. The scope is the ATTACH's dp_rank (scope.go):
//
//	ATTACH without dp_rank   scope ALL: one producer for every attention-DP rank of the worker (TensorRT-LLM: one
//	                         LocalIndexer per worker, apply_cleared(seq) without a rank). A Cleared clears the
//	                         whole stream, i.e. every rank of the worker: what TRT-LLM means (the engine dropped its
//	                         whole cache). Upstream Dynamo 1.6.1 clears only the event's (worker, dp_rank); the
//	                         conformance table lists the multi-rank case as a documented deviation.
//	ATTACH with dp_rank r    scope r: one producer per rank with its own seq space (vLLM: one publisher and one
//	                         LocalIndexer(..., dp_rank=r) or KVSHM_DP_RANK per rank). A Cleared clears that rank's
//	                         stream only. Its events are stored as published (the consumer rewrites dp_rank).
//
// A second live producer for the same key is refused with conflict; the message says that producers publishing one
// rank each must pass dp_rank. A dead producer's successor on the same key is a producer restart (below). An ALL
// stream and per-rank streams of the same worker may coexist (independent indexes and seq spaces).
//
//	ATTACH validation, in order (each failure is an error reply; nothing changes):
//	  peer uid (SO_PEERCRED, checked at accept) == daemon uid                    forbidden
//	  ring_path absolute, kv_block_size > 0                                      bad_request
//	  ring is a regular file (not a symlink), owned by the peer uid,
//	  not group/other writable                                                   not_found / forbidden
//	  shm.Open validates the header; the file was not swapped meanwhile          bad_request / conflict
//	  header worker_id, kv_block_size (and max_buffer_size when given) match     bad_request
//	  no live producer on the (worker, scope) key, none on this connection       conflict
//	  ring capacity, publish buffer_steps and hwm within the bounds (bounds.go)  limit
//	  the peer has fewer than --max-streams-per-peer streams attached            limit
//
// lifecycle.go carries these tables out: openRing is the validation, planAttach the outcome table as a pure
// function of the stream's and the ring's state (TestPlanAttach), install the step that applies its decision:
// planInstall (pure, TestPlanInstall) decides the steps, applyInstall takes them.
//
//	Outcome                                        index                              reply / stats
//	first attach of the worker, head = 0           new                                stream_epoch 1, resumed false
//	first attach, head > 0, a checkpoint for this  restored from the checkpoint       resumed true, restored true,
//	worker, ring epoch and head (--state-dir;                                         nothing lost; checkpoint deleted
//	with --checkpoint-interval also after a crash,                                    (with --checkpoint-interval
//	the ring replaying the records after it)                                          kept until replaced)
//	first attach, head > 0, no usable checkpoint   new + MarkUnknownHistory           resumed true, incomplete: dumps are
//	(crash without --checkpoint-interval, no                                          incomplete (Error with --on-loss=
//	--state-dir, head moved, corrupt)                                                 error) until a Cleared re-bases
//	same worker, same ring epoch (reattach)        kept; continues at the head         resumed true, same stream_epoch
//	same worker, new ring epoch (producer restart) replaced (its cache is empty)      stream_epoch+1, resets+1,
//	                                                                                  the worker's checkpoints deleted
//	producer pid gone (EOF then the pid check, or  kept, queryable; the incarnation   attached=false, producer_alive=false
//	the idle pid check) / ring state CLOSED at EOF ends: a Cleared applied (below)
//	producer EOF while its pid lives               kept, queryable; the incarnation   same as above; its pid is watched
//	(a broken connection)                          goes on (it may reattach)          (5 ms for 1 s, then --pid-check-
//	                                                                                  interval); gone: the end
//	DETACH                                         kept, queryable; the incarnation   attached=false, producer_alive=false
//	                                               ends: a Cleared applied (below)
//	FORGET of a detached/dead stream               dropped with its metric series     not_found from then on; a
//	                                               and its checkpoints                later attach starts a new stream
//	FORGET while a producer is attached            kept (refused)                     conflict
//	dead (no attachment, no pid watch) and not     dropped as by FORGET (reap.go);    not_found from then on
//	asked for in --dead-stream-retention,          a never-ended incarnation ends
//	or beyond --max-dead-streams                   first (its Cleared)
//	SIGTERM / SIGINT / parent gone                 rings drained, head stored, then   exit 0 (parent gone: every
//	                                               (--state-dir) each stream attached incarnation ends first)
//	                                               at the stop is checkpointed (with
//	                                               --checkpoint-interval: before the
//	                                               head is stored, by the final drain)
//
// The steps are the stream engine's (package stream): NewStream or Restart, then Stream.Attach. What an
// attachment's end does, and the producer incarnations (when one begins, when it ends, its Cleared), are the
// engine's too: package stream, "Streams and their lifecycle".
//
// # Checkpoints (--state-dir)
//
// A planned restart loses nothing (the checkpoint plus the ring as the log). At a graceful shutdown, after
// the final drain of every stream that had a producer attached when the shutdown began, the index is written with
// index.WriteCheckpoint to <state-dir>/w<worker_id>-<ring epoch>.ckpt for an ALL stream, or
// w<worker_id>r<dp_rank>-<ring epoch>.ckpt for a per-rank stream (temporary 0600 file, fsync, rename, fsync of
// the directory), its meta recording the worker, the ring epoch and the ring head released by that final drain.
// The first ATTACH of that worker in the next daemon, on a ring with head > 0, reads the file for the ring's epoch
// (outside the server lock) and restores it only if worker, epoch, head and index config (block size, max buffer
// size) all match the ring: then the index is exactly "every record before head applied", and the records the
// producer published meanwhile follow. Otherwise the stream starts with unknown history as without --state-dir,
// and the reason is logged. Either way every checkpoint of that worker is then deleted (consumed or stale), as on a
// stream reset (new epoch) or FORGET, so a checkpoint is never applied twice: a head only grows, so a file whose head
// is behind the ring can never become valid again. A crash (SIGKILL, OOM) writes nothing: the next daemon reports
// unknown history. Write and read failures are logged and counted, never stop a shutdown or an attach;
// an unsafe state directory (not ours, or any group/other permission) stops Listen with ErrUnsafeStateDir, and
// leftover temporary files of an interrupted write are removed at Listen. It is off by default: it writes ~53 bytes
// per resident block per worker (53 MB for 1M blocks; ~0.2 s to write, ~0.3 s to read), which an operator should
// place deliberately (a tmpfs like the socket's directory loses it at reboot, with the rings themselves).
//
// With --checkpoint-interval D a crash loses nothing either: the drain releases the ring head only up to a written
// checkpoint (package stream, "Continuous checkpoints": when one is written, asynchronously, and what it costs);
// this package writes and restores the files as above.
//
// # Losses
//
// A loss inside kvshm (a LOSS record: the producer found the ring full; a corrupt ring record or malformed event;
// a resumed ring with unknown history) is marked on the index, which answers by the --on-loss policy:
// best-effort (default, index.LossBestEffort) answers what Dynamo would answer from the events applied and marks
// the Response Incomplete with the lost ranges; error (index.LossError) answers the Error variant until a Cleared
// re-bases the stream. An id gap without a LOSS record is not a loss (the producer never handed those ids over, as
// vLLM does when it skips feeding an event): it is answered across as Dynamo does and only counted
// (kvshm_seq_gaps_total). Every Incomplete answer is reported:
//
//	HTTP headers on every /kv_recover route    Kvshm-State: incomplete; Kvshm-Lost-Events: 80-80,95-97 (inclusive
//	                                           ranges, the newest 32; an unknown-history point as unknown-N, N the
//	                                           first id after it); both absent on a complete answer, and on the
//	                                           Error variant of --on-loss=error
//	metric                                     kvshm_incomplete_answers_total{worker_id,dp_rank}
//	log                                        one warn line per stream per 10 s with the lost ranges and how many
//	                                           lines were suppressed
//	STATS / kvshmd stats                       "incomplete": true, "lost_ranges", "lost_events" (until a Cleared)
//
// How a loss is found and marked (LOSS records, the ring header's pending range, corruption, wire seqs for lost
// engine seqs) is the stream engine's: package stream, "Losses".
//
// # Recovery routes (--http) and rank ports
//
// Handler serves Go 1.22 ServeMux patterns; recovery answers are the WorkerKvQueryResponse JSON with status 200 for
// every variant, errors {"error","code"} with 400 (bad query or path), 404 (no such stream), 409 (ambiguous: the
// message lists the URLs to use), 503 (busy):
//
//	GET /kv_recover?start=&end=[&worker_id=][&dp_rank=]       what the consumer calls; resolved as below
//	GET /workers/{worker_id}/kv_recover?start=&end=           for /register of one worker on a shared daemon
//	GET /workers/{worker_id}/dp/{dp_rank}/kv_recover?...       one (worker, rank)
//	GET /metrics, GET /healthz                                (and HEAD; another method: 405)
//
//	worker  dp_rank  answer (resolveLocked)
//	-       -        the only stream; 409 listing every stream's URL when there are several; 404 when none
//	w       -        w's ALL stream, else w's only stream; 409 listing w's rank URLs; 404 when none
//	w       r        the per-rank stream (w, r), else the rank view of w's ALL stream (Indexer.RecoverRank:
//	                 that rank's events plus every Cleared, that rank's blocks, the stream's last_event_id)
//	-       r        as (w, r) for the only worker; 409 listing /workers/{w}/dp/{r}/kv_recover per worker
//
// The socket's EVENTS, DUMP, STATS and MATCH take the same optional worker_id and dp_rank. --rank-ports BASE (off by
// default; needs --http, whose host it uses): port BASE+r answers /kv_recover (start, end) as
// /workers/{w}/dp/{r}/kv_recover for the daemon's only worker (409 with several, 404 with none), for consumers that
// find a rank's endpoint by pod discovery (recover_port + dp_rank). A listener opens the first time the daemon
// holds a stream covering r: a per-rank ATTACH (before its reply) or the first rank-r event of an ALL stream (the
// drain goroutine only asks for it; an opener goroutine binds it, and a query that follows the event waits for
// that: rankports.go). A bind failure, a port
// above 65535 or more than 256 ranks is logged and counted (kvshm_rank_port_errors_total), never fatal, and not
// retried; the rank stays reachable at its /workers URL. All HTTP listeners share the --http-max-conns bound.
//
// # Socket protocol
//
// The frame format, the request and reply bodies, stream selection by worker_id and dp_rank, and the error codes
// are specified in proto/sock/PROTOCOL.md (package sock holds the codec, the types and the Go client); this
// package serves them (server.go, handlers.go). FORGET drops the stream's index, counters and every metric series
// labelled with its worker_id and dp_rank (the reaper does the same by itself for dead streams: reap.go);
// a later ATTACH of that worker starts a new stream (stream_epoch 1). FORGET of a stream whose producer is
// detaching forgets it after its final drain.
//
// # Failure outcomes
//
//	input                                             outcome
//	length < 4                                        bad_request reply, connection closed
//	length > cap                                      too_large reply, connection closed (body never read)
//	version ≠ 1 (e.g. HTTP or garbage on the socket)  unsupported_version reply, connection closed
//	unknown kind / nonzero request status / bad JSON  unknown_kind / bad_request reply, connection stays usable
//	(JSON: a key in another case, a duplicate key,    (request bodies decode strictly: sock.DecodeStrict)
//	null, trailing data are bad JSON too)
//	frame started but not finished in --frame-timeout connection closed (counted: frame_timeout)
//	non-producer connection silent for --idle-timeout connection closed (counted: idle); clients reconnect
//	reply not written in --write-timeout              connection closed
//	more than --max-conns connections                 busy frame (kind 0), connection closed
//	more than --http-max-conns HTTP connections       503 {"code":"busy"} at once, connection closed
//	HTTP headers not complete in 10 s                 connection closed (ReadHeaderTimeout)
//	HTTP keep-alive connection idle for 2 min         connection closed (IdleTimeout)
//	peer of another uid                               forbidden frame (kind 0), connection closed; the 0600 socket
//	                                                  in a 0700 directory normally stops it at connect() already
//	query waits > --query-timeout (drain, dump build) busy reply
//	corrupt ring record (bad type/length, bad tail)   counted, logged once per position, SkipToTail, the index is
//	                                                  marked unknown-history (dumps are incomplete, or Error with
//	                                                  --on-loss=error, until a Cleared)
//	corrupt tail word more than a ring ahead          SkipToTail stays; the producer's next publish rewrites it
//	corrupt tail word within a ring ahead             the reader skips there; the producer re-bases at that head
//	                                                  (one event dropped, reported by a LOSS record): no wedge
//	ring file truncated under the daemon (SIGBUS;     a memory fault on the drain worker (SetPanicOnFault, recovered
//	an idle stream checks the size at each            per ring: drain.Stream.Fault), a futex_waitv EFAULT, or the
//	housekeeping, ≤ 1 s, 10 ms publishing)            idle size check (shm.Reader.Truncated): only
//	                                                  that attachment ends (unknown history, counted, logged, the
//	                                                  producer's connection closed); the daemon goes on
//	ring state word reads CLOSED, producer connected  ignored (logged once): only the producer ends its stream
//	DETACH of a live producer from another client     forbidden: the producer detaches on its ATTACH connection;
//	                                                  FORGET drops a worker whose producer is gone
//	malformed FlatBuffer in an EVENT record           counted, logged, unknown-history, record skipped
//	malformed BATCH record (layout, a sub-record's    counted (malformed_events), logged, unknown-history, the whole
//	FlatBuffer or Meta, seqs or dp_ranks differ)      batch skipped (nothing applied, nothing published)
//	ATTACH publish endpoint refused or not bindable   bad_request naming the endpoint and errno; nothing attached (a
//	                                                  stream's previous publisher with another config is closed)
//	a ZMQ peer (subscriber, replay client, or         only that peer: refused, cut and counted by reason; ingest and
//	anything that reaches the sockets): slow, stuck,  every other peer never wait (zmqpub/doc.go, "Bounds", has each
//	hostile, or past a bound                          bound, its refusal and its test; zmqpub/FORMAT.md the bytes)
//	engine dies (pid gone, DETACH, CLOSED) or         its incarnation ends: Cleared applied to the index and, when
//	restarts (new ring epoch)                         publishing, published with the next wire seq as a replay
//	                                                  reset (docs/lifecycle.md); a restart then begins with another
//	producer connection breaks, pid alive             not an end; the pid is watched until it reattaches or dies
//	--cleanup-dir not 0700 or not ours, or without    Listen fails with ErrUnsafeCleanupDir (serve exits 1):
//	the launcher's token (--cleanup-token)            nothing removed (owndir.go)
//	the same found at exit (replaced, token gone)     not removed (ErrUnsafeCleanupDir), logged; exit as usual
//	--state-dir locked by another live kvshmd         Listen fails with ErrStateDirLocked naming its pid and
//	                                                  socket (serve exits 1); its files are left alone
//	HTTP method other than GET or HEAD on /metrics,   405, Allow: GET, HEAD
//	/healthz
//	ATTACH ring capacity > --max-ring-bytes           limit: "ring capacity N bytes is beyond this daemon's bound of
//	                                                  M (kvshmd serve --max-ring-bytes or KVSHMD_MAX_RING_BYTES
//	                                                  raises it; the producer sets it with KVSHM_RING_BYTES)"
//	ATTACH publish buffer_steps > --max-buffer-steps  limit: "publish buffer_steps N is beyond this daemon's bound of
//	                                                  M (kvshmd serve --max-buffer-steps or KVSHMD_MAX_BUFFER_STEPS
//	                                                  raises it; ...)"; nothing attached
//	ATTACH publish hwm > --max-hwm                    limit: "publish hwm N is beyond this daemon's bound of M
//	                                                  (kvshmd serve --max-hwm or KVSHMD_MAX_HWM raises it)"
//	ATTACH from a peer (uid+pid) with                 limit: "peer pid P already has N streams attached, this
//	--max-streams-per-peer streams attached           daemon's bound (kvshmd serve --max-streams-per-peer or
//	                                                  KVSHMD_MAX_STREAMS_PER_PEER raises it)"
//	connection from a peer with --max-conns-per-peer  limit frame (kind 0): "peer pid P already has N connections
//	open                                              open, this daemon's bound (kvshmd serve --max-conns-per-peer
//	                                                  or KVSHMD_MAX_CONNS_PER_PEER raises it)", closed; counted
//	                                                  kvshm_connections_rejected_total{reason=limit}
//	a stream's replay buffer past --zmq-buffer-bytes  the oldest batches evicted (never refused): its replays from
//	or its buffer_steps                               before them are incomplete (counted, logged)
//	panic while decoding/applying a record (a bug)    recovered; same as a malformed event (logged with the stack)
//	LOSS record (producer found the ring full)        index.MarkLost(first, last): exactly those ids are lost (the
//	                                                  part already marked from the header is not marked again)
//	ring header shows a pending loss, ring empty      the header's range is marked lost at once: the
//	(the engine went idle after the drops)            next answer is incomplete (best-effort) or Error (strict)
//	an answer misses lost events                      --on-loss=best-effort: the best state, Kvshm-State and
//	                                                  Kvshm-Lost-Events headers, counted, logged (rate-limited);
//	                                                  --on-loss=error: the Error variant until a Cleared
//	seq gap (no LOSS record) / backwards seq          not a loss: answered across (counted seq_gaps_total) / the
//	                                                  log restarts (counted event_id_resets_total)
//	token count ≠ blocks × block_size                 applied as Dynamo does, counted, logged (rate-limited)
//	second live producer for a (worker, scope) key    conflict reply naming the scope and the dp_rank hint
//	query for a worker with several per-rank streams  409 / conflict listing /workers/{w}/dp/{r}/kv_recover URLs
//	rank port cannot be bound (or > 65535, > 256)     logged, kvshm_rank_port_errors_total; the daemon goes on
//	--rank-ports without --http, or outside 1..65535  New fails with ErrRankPorts (serve: usage error)
//	socket path holds a live daemon                   Listen fails with ErrAlreadyRunning
//	socket path holds a dead daemon's socket          removed (dial → ECONNREFUSED) and replaced
//	socket path holds a non-socket file               Listen fails with ErrNotSocket (never removed)
//	socket directory not ours or group/other writable Listen fails with ErrUnsafeDir
//	--state-dir not ours or any group/other perm      Listen fails with ErrUnsafeStateDir
//	daemon SIGTERM/SIGINT, then restarted (planned)   with --state-dir: attached streams checkpointed after the final
//	                                                  drain, restored at reattach (restored: true), nothing lost
//	daemon SIGKILLed / crashed, then restarted        ring resumed at the stored head, unknown history (dumps
//	                                                  incomplete until a Cleared: Kvshm-Lost-Events unknown-N);
//	                                                  kvshm_checkpoint_restores_total{result=missing}
//	the same with --checkpoint-interval               the newest checkpoint (head = stored head) is restored and the
//	                                                  ring replayed: restored, not tainted, nothing lost
//	crash while a checkpoint is being written         temporary file removed at Listen; the previous checkpoint
//	(--checkpoint-interval)                           still matches the head: restored, nothing lost
//	crash after a checkpoint's rename, before its     the checkpoint is ahead of the ring's head by whole records:
//	head release                                      restored, the ring resumed after them (shm.Reader.SkipTo):
//	                                                  nothing lost, nothing applied twice
//	checkpoint path not a regular file (symlink,      not followed, not read (O_NOFOLLOW, O_NONBLOCK, fstat):
//	FIFO, device)                                     unknown history, {result=error}; reads never exceed the
//	                                                  file's size
//	checkpoint head behind the ring (another daemon   unknown history, logged, counted {result=stale}, file deleted
//	consumed it without --state-dir), or ahead of it
//	but not at a record's end, other config
//	checkpoint corrupt (checksum, truncation, bad     unknown history, logged, counted {result=corrupt}, file
//	structure)                                        deleted; never a crash
//	checkpoint write fails (disk full, permissions)   logged, kvshm_checkpoint_writes_total{result=failed}; shutdown
//	                                                  goes on; the next daemon reports unknown history
//	the same during a run (--checkpoint-interval)     also: the worker's checkpoints deleted, the head released
//	                                                  anyway; a crash before the next good checkpoint reports unknown
//	                                                  history ({result=missing})
//	--checkpoint-interval without --state-dir, or < 0 New fails with ErrCheckpointInterval (serve: usage error)
//
// # Per-producer bounds (bounds.go)
//
// A shared daemon serves every engine of a node: no producer's config may take it down or crowd the others out. A
// peer is a uid+pid (SO_PEERCRED). What a peer may ask is bounded, each bound a serve flag with a KVSHMD_* variable
// (Config.Bounds; defaults pass vLLM's own defaults by far: buffer_steps 10000, hwm 100000, a 64 MiB ring): ring
// capacity --max-ring-bytes (the daemon maps the whole ring), publish buffer_steps --max-buffer-steps, publish hwm
// --max-hwm, streams attached at once --max-streams-per-peer, socket connections open at once --max-conns-per-peer
// (within --max-conns); `kvshmd serve -h` gives their defaults. A request beyond one is refused with
// limit and a message naming the bound and its flag (the failure table above); nothing is attached. Applied rather
// than asked: each publishing stream's replay buffer holds at most --zmq-buffer-bytes payload bytes and is grown as
// used, each subscriber's and replay client's queue at most 16 MiB (package zmqpub). So one peer holds at most
// --max-streams-per-peer streams × (--zmq-buffer-bytes of replay buffer + its subscribers' queues) and
// --max-conns-per-peer of the --max-conns connections, and a hostile peer cannot stop another's stream
// (TestHostileProducerCannotStopAnother).
//
// Daemon memory: --max-memory (KVSHMD_MAX_MEMORY) sets the Go runtime's soft limit (debug.SetMemoryLimit); without
// it the runtime honours GOMEMLIMIT by itself. Both, because GOMEMLIMIT is what Go operators already set in a
// container and the flag is where kvshmd's other bounds are documented. Neither refuses an allocation: near the
// limit the GC runs harder instead of letting the heap grow to twice the live data (GOGC), so a daemon under a
// cgroup limit is not OOM-killed for garbage; the live data itself is bounded by the bounds above. Set it a little
// below the cgroup's limit. The rings are shared memory owned by their producers, outside the Go heap. Headroom:
// serve sets GOGC after each collection so the heap may grow by about --gc-headroom over its live data,
// within GOGC 12..50 (cmd/kvshmd/gcpolicy.go; off with 0 or when GOGC is set): at millions of blocks the live data
// is the indexes, pointer-free arrays the collector barely scans, and doubling them (GOGC=100) doubled the daemon.
// An answer of 32 MiB or more (a TreeDump of ~400 k blocks) is followed, once written, by one debug.FreeOSMemory
// (memory.go): the runtime's scavenger would return its pages only over seconds to minutes. RssAnon per resident
// block against the reference's process is measured by bench/recovery_bench.py (--only scale; bench/RESULTS.md);
// at 100 k blocks the daemon holds ~50 MB in all and that figure is mostly the collector's cycle at the moment of
// sampling plus the log's and runtime's fixed costs. Per block: the index 96 B,
// the cached dump 16 B (index/doc.go, "Memory"), the event log a few MB per stream whatever the tree's size.
//
// # Publishing on ZMQ
//
// A producer may ask, in its ATTACH (sock.AttachRequest.Publish), that kvshmd publish the stream on ZMQ in vLLM's
// KV-event wire format; openRing validates the publish object (publishreq.go: an unknown wire name is bad_request),
// a bind failure is ATTACH's bad_request (nothing is attached), and every ATTACH reply says "batches": true (this
// daemon reads BATCH records) and whether the stream is "publishing". The rest (the stream's publisher, what the
// drain publishes, wire seqs, incarnation batches, heartbeats, replay snapshots, contiguous replies) is the stream
// engine's: package stream, "Publishing on ZMQ".
//
// # Private daemon exit (--parent-pid, --cleanup-dir)
//
// The parent is watched through a pidfd the Go netpoller waits on (pidwatch.go, waitExit): no wakeup until it
// exits; where the kernel has no pidfd, /proc is polled every Config.ParentPoll. When the --parent-pid process is
// gone the daemon shuts down as on SIGTERM, except that every stream's
// incarnation ends (its Cleared is published and flushed before the sockets close). Then, with Config.CleanupDir
// (--cleanup-dir), after everything is closed, the directory is removed recursively, only if it is still the one
// the launcher made for this daemon, proven by its --cleanup-token (owndir.go: checked at Listen, which refuses to
// start otherwise, and again before the removal).
//
// # Metrics
//
// Under kvshm_, from a non-global prometheus.Registry (Config.Registry); per-stream series carry the worker_id and
// dp_rank labels (dp_rank is the stream's scope: the rank of a per-rank stream, empty for an ALL stream, which
// Prometheus treats as absent; a rank view of an ALL stream counts under the ALL stream, so the series are bounded
// by the streams) and are read at scrape time (no per-event metric cost). See metrics.go for the list; the
// README lists them with their meaning. promtool check metrics passes on /metrics (TestIntegrationProcess).
//
// # Caveats
//
// The drain's own caveats (payloads aliasing the mapping, streams sharing a drain worker, what a continuous
// checkpoint holds back) are the stream engine's: package stream, "Caveats".
// Checkpoints: one --state-dir per daemon (files are named by worker id, scope and ring epoch only, and a stream
// reset deletes every file of its stream): a second daemon on it refuses to start (owndir.go). Only streams with
// an attached producer at the stop are checkpointed; a file whose producer never comes back stays until an
// operator removes it (FORGET and the reaper reach only streams the running daemon knows). A restored index has no
// dump cache, so its first dump is built from the tree: equivalent to, but not always byte-equal with, a cached
// dump the old daemon had extended with the log tail (the same difference any cache invalidation makes).
// An idle stream costs one housekeeping call per second (coalesced per worker: one wakeup per worker per second),
// so idle CPU grows slowly with the number of idle streams (README, "Performance", has the measured figures). The
// pid backstop is only armed when the attaching process is the ring's producer_pid (same pid namespace); otherwise socket EOF is the only death
// signal, so its end is seen only at DETACH or CLOSED (and a broken connection looks like an end never). A
// stream's index is kept while the daemon runs until an operator sends FORGET (`kvshmd forget`) or the reaper drops
// it (reap.go); a recovery query that selected the stream just before it was dropped may re-create its recovery_*
// series once. Panic
// containment relies on the index releasing its lock when a panic unwinds through it (its writer paths unlock
// with defer), so the following MarkUnknownHistory can take the lock again.
package daemon
