// Package zmqpub publishes one kvshmd stream's KV-event batches on ZMQ as vLLM's ZmqEventPublisher does: a PUB
// socket carrying [topic, seq u64 BE, payload] and, optionally, a ROUTER socket answering replay requests from a
// buffer of the last batches. The payload is built by package vllmwire. The sockets speak ZMTP 3.0 (NULL mechanism)
// themselves (zmtp.go, transport.go), in pure Go, so kvshmd stays CGO_ENABLED=0; libzmq (pyzmq, Dynamo), zmq4 and
// raw-frame tests are their peers.
//
// # Design
//
//	drain goroutine ──Publish (inline, never waits)──► each subscriber: non-blocking writev when its queue is empty,
//	                                                   │                else (and for what that write left) its queue
//	                                                   │                ──► its writer goroutine (stall timeout)
//	                                                   └► replay buffer (mutex)
//	replay client connection ── ["", start_seq] ──► its reader ──► its reply goroutine
//	                         ◄── ["", topic, seq, payload] per buffered batch with seq >= start,
//	                             then ["", "", 0xFFFFFFFFFFFFFFFF, ""]
//
// Publish never waits: it builds the message once ([topic, seq, payload], the payload shared, not copied) and hands
// it to every subscriber whose subscriptions match the topic, in the caller's goroutine. A subscriber with nothing
// queued gets it written at once by one non-blocking writev (its socket is O_NONBLOCK; the write never parks); what
// that write leaves (a partial write, EAGAIN: the peer's window or the socket buffer is full) is queued as the
// subscriber's first message, and while anything is queued a message is only queued: the connection's writer
// goroutine writes the queue in order, under the stall timeout. So the bytes go out in call order, and at 1,000
// batches/s to a subscriber that keeps up no goroutine is woken per batch (before, Publish queued to a sender
// goroutine that queued to each connection's writer goroutine: two wake-ups, each a futex wake of an OS thread).
// The replay buffer is in memory: a restarted daemon replays only what it published since.
//
// # Heartbeats, resets, flush (docs/lifecycle.md)
//
// Batches (Publish: published, kept for replay), heartbeats (PublishHeartbeat: published, never kept) and resets
// (PublishReset: the replay buffer is emptied, then the batch is published and kept as the buffer's first batch: the
// start or the end of an engine incarnation) are handed out in call order by the calls themselves, under one lock
// that Flush and Close also take. None is ever dropped before Close (there is no queue to be full: a subscriber
// that falls behind is cut instead, see Connections; DropQueueFull is no longer produced, a stable metric label);
// after Close each returns false (counted DropClosed). Flush returns true once every subscriber connected at the
// call has had every message handed out before the call written to its socket (a subscriber cut meanwhile no
// longer counts); false at its timeout or after Close.
//
// # The replay buffer
//
// It grows as used (nothing is allocated for buffer_steps up front: 2^31-1 steps cost nothing until batches arrive;
// before, New allocated the whole ring and buffer_steps 2^31-1 killed a shared daemon with a 64 GiB allocation) and
// holds at most buffer_steps batches and at most Config.BufferBytes payload bytes (DefaultBufferBytes, 64 MiB, when
// 0; the daemon passes its --zmq-buffer-bytes); the oldest are evicted first, and a batch larger than the byte cap is
// not kept. A reply is incomplete when the requested seq is before the oldest buffered batch and that batch is not a
// reset batch (the buffer rolled over, or this publisher began mid-incarnation: the daemon restarted), or, the buffer
// empty, when a batch at or after the requested seq was evicted, or when the batch a reply was about to send is
// evicted during the reply (the reply ends there): counted (Stats.ReplayIncomplete) and logged at most once per 10 s.
// A request from before a reset batch is complete: that batch is the incarnation's start. A reset during a reply
// ends the reply (end marker); the reset batch itself goes out live.
//
// A reply walks the buffer with a cursor, 64 batches per lock, over the batches held when the request came: a slow
// client holds no copy of the buffer, only its place.
//
// A buffer that never saw a reset batch began mid-incarnation (a restarted daemon, a replaced publisher): empty, it
// answers every request incomplete (it answered them complete and empty before, so a router restarted after kvshmd
// restarted got nothing).
//
// # Snapshots (snapshot.go; docs/replay-snapshots.md)
//
// With a Snapshotter (SetSnapshotter), a request the buffer cannot answer completely is answered with the
// Snapshot's batches, each under its seq L (the last batch the state includes), then the buffered batches with seq
// > L, then the end marker; a request from after L needs no snapshot and gets the buffer. A snapshot is cached and
// reused while the buffer holds every batch after L that it kept (nothing after L evicted since), if it is at most
// 16 MiB (larger: dropped once no reply uses it); at most one build runs per publisher (other requests wait for it
// and share it, or give up with it when it fails), and builds run in a slot of a SnapshotLimit shared
// by the publishers it bounds (a build finding none free waits, in its own reply goroutine, until one frees or its
// client goes away). Each reply that needed one is counted by outcome (Stats.Snapshots: built, shared, waited,
// unavailable); a build error (logged at most once per 10 s) leaves the reply the buffer's, counted incomplete.
// The snapshot's batches are shared by every reply, never copied, and paced by each client's queue like any reply.
// A reply from seq 0 sends the Snapshot's Fresh batches and leaves out a reset batch that opens the buffer: its
// consumer holds nothing of the stream, so what only clears has nothing to clear (Snapshot says why it matters).
//
// # Contiguous replies (fill.go)
//
// With a filler (SetFiller), a reply carries every seq from the requested one to the newest published: the seqs
// the buffer does not hold but whose content is known (heartbeats, seqs before a reset batch or a snapshot) go as
// the filler's empty batch, and a snapshot's batches take the seqs up to its L. A reply that cannot be made so
// (incomplete without a snapshot, seqs of lost batches: MarkLost, or more fillers than the bound) keeps its gaps
// and is counted (Stats.ReplayGapped).
//
// # Replay framing
//
// Follows vLLM 0.33.0's _service_replay: a request is exactly 3 frames once a ROUTER adds the identity frame
// ([identity, "", start_seq]), so ["", start_seq] on the wire; vLLM reads start_seq as a big-endian integer of any
// length, kvshm requires 1..8 bytes. Anything else is counted (BadRequests), ignored, and logged at most once per
// 10 s (with the number suppressed since the last warning); a message of more than 16 frames disconnects its
// client. Replies carry the topic frame as vLLM's do, so a DEALER receives ["", topic, seq, payload]; Dynamo's
// listener accepts that (vLLM's shape) and ["", seq, payload] (SGLang's). Each client connection is its own peer
// (no identities are needed to route replies); its requests are answered in order.
//
// ZMTP commands are not requests: a libzmq peer with ZMQ_HEARTBEAT_IVL sends PING (Dynamo 1.6.1's replay DEALER and
// SUB: every 5 s, timeout and TTL 15 s) and drops the connection when nothing comes back within the timeout. Both
// sockets answer PING with PONG (echoing its context) and ignore other commands. (zmq4's ROUTER, used before, handed
// a PING on as a 2-frame message: kvshmd logged "invalid zmq replay request: ignored frames=2" every 5 s and never
// answered; zmq4's PUB stopped reading a subscriber after its 10th PING, subscriptions included.)
//
// # Connections (every bound, and what exceeding it does)
//
// Every connection has a queue and a writer goroutine of its own; a write by Publish never waits (non-blocking,
// only when the queue is empty), the writer's waits at most Config.StallTimeout (default 2 s). So one peer that
// stops reading costs only its own queue and never delays another peer.
//
//   - A subscriber is cut (its connection closed, counted in Stats.Cut) when its queue would exceed
//     Config.SubscriberBacklog bytes (default 16 MiB) or Config.HWM messages (0: no message bound; libzmq drops
//     past its per-peer HWM instead), or a write to it blocks for the stall timeout. Its libzmq peer reconnects by
//     itself and sees a seq gap, which it can fill from the replay socket. Ingest is never affected.
//   - A replay client's reply is paced by its own queue (SubscriberBacklog bytes: the reply goroutine waits for room,
//     so a large reply is never cut for its size); a client whose write blocks for the stall timeout is cut
//     (Stats.ReplayCut). 8 clients that request the whole buffer and never read leave a healthy client's replay
//     unaffected (TestStuckReplayClientsCostOnlyThemselves; with zmq4's ROUTER they denied it for 40-60 s).
//   - Handshakes run in a goroutine per connection with the stall timeout as deadline, at most 128 at once per
//     socket (one more is closed at once); a connection whose handshake fails (garbage, a stall, a wrong socket
//     type: a PUB accepts SUB and XSUB, the replay socket DEALER, REQ and ROUTER) is closed
//     (TestStalledConnectionsDoNotBlockNewPeers, TestFailedHandshakesAreClosed). A socket keeps at most 1024
//     connections; one more is closed after its handshake. A frame a peer sends is at most 64 KiB (requests,
//     subscriptions and commands are small); a larger one disconnects it.
//
// Endpoints: bound when the endpoint contains "*" or "::" or is ipc:// (vLLM's rule), connected otherwise (in
// the background, again 100 ms after every failure or disconnection, as libzmq connects); inproc:// is refused
// (ErrEndpoint); the replay endpoint is always bound. "tcp://*:port" binds every IPv4 interface (libzmq's "*"
// without ZMQ_IPV6); "tcp://*:0" binds an OS-chosen port and Stats().Endpoint reports it (vLLM binds the node IP
// instead). An ipc:// socket file is chmod 0600 right after the bind (a short window with the umask's mode; the
// directory is the operator's); a socket file already at the path (left by a crashed run) is replaced, as libzmq
// does, anything else there fails the bind; Close removes the files it bound.
//
// # Errors
//
// New fails with ErrEndpoint (refused endpoint, nothing opened), ErrBind (bind or chmod failed; the message names
// the endpoint and the errno) or ErrConfig (a negative hwm, buffer_steps, buffer bytes, stall timeout or subscriber
// backlog); on error nothing stays open. After New nothing fails: a subscriber or a replay client that cannot be
// written to is cut and counted. Close hands what is queued to the subscribers' queues and gives them at most 1 s
// (or the stall timeout, if shorter) to be written; it is idempotent; Publish after Close drops (closed).
//
// # Concurrency
//
// Publish, PublishHeartbeat and PublishReset are called by one goroutine at a time (the stream's drain goroutine or
// the daemon's lifecycle code, ordered by the stream), and pay the writes to the subscribers that keep up (a writev
// of a few KiB each); Flush, Stats, Config and Close are safe from any goroutine.
// The payload handed to Publish is owned by the publisher from then on.
package zmqpub
