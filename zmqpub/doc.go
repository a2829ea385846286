// Package zmqpub publishes one kvshmd stream's KV-event batches on ZMQ as vLLM's ZmqEventPublisher does: a PUB
// socket carrying [topic, seq u64 BE, payload] and, optionally, a ROUTER socket answering replay requests from a
// buffer of the last buffer_steps batches. The payload is built by package vllmwire; the sockets are
// github.com/go-zeromq/zmq4 (pure Go, so kvshmd stays CGO_ENABLED=0).
//
// # Design
//
//	drain goroutine ──Publish (non-blocking, bounded queue; full = drop counted)──► sender goroutine
//	                                                                                 │ PUB SendMulti (queues only)
//	                                                                                 │ replay ring (mutex)
//	replay goroutine ◄── ROUTER [identity, "", start_seq] ── DEALER
//	                 ──► [identity, "", topic, seq, payload] per buffered batch with seq >= start,
//	                     then [identity, "", "", 0xFFFFFFFFFFFFFFFF, ""]
//
// Publish never waits: it tries the queue and counts a drop (queue_full) when it is full. The sender goroutine
// owns the PUB socket; the replay goroutine owns the ROUTER socket, so a slow replay client never delays live
// publication. The replay buffer is in memory: a restarted daemon replays only what it published since.
//
// # Heartbeats, resets, flush (LIFECYCLE.md)
//
// One queue carries, in call order, four kinds of item to the sender goroutine: batches (Publish: published, kept
// for replay), heartbeats (PublishHeartbeat: published, never kept), resets (PublishReset: the replay buffer is
// emptied, then the batch is published and kept as the buffer's first batch: the start or the end of an engine
// incarnation) and flush markers (Flush). Batches and heartbeats share the queue's DefaultQueueSize places and are
// dropped (queue_full) past them; resets and flush markers take no place, so a full queue never drops them
// (PublishReset returns false only after Close). Flush returns true once the sender has handed every earlier item to
// the PUB socket and every connected subscriber's outbox is empty (a subscriber cut meanwhile no longer counts);
// false at its timeout or after Close.
//
// The replay buffer grows as used (nothing is allocated for buffer_steps up front: 2^31-1 steps cost nothing until
// batches arrive) and holds at most buffer_steps batches and at most Config.BufferBytes payload bytes
// (DefaultBufferBytes, 64 MiB, when 0); the oldest are evicted first, and a batch larger than the byte cap is not
// kept. A reply is incomplete when the requested seq is before the oldest buffered batch and that batch is not a
// reset batch (the buffer rolled over, or this publisher began mid-incarnation: the daemon restarted), or, the
// buffer empty, when a batch at or after the requested seq was evicted: counted (Stats.ReplayIncomplete) and logged
// at most once per 10 s. A request from before a reset batch is complete: that batch is the incarnation's start.
//
// Endpoints: bound when the endpoint contains "*" or "::" or is ipc:// (vLLM's rule), connected otherwise (in
// the background with zmq4's retries, as libzmq connects asynchronously); inproc:// is refused (ErrEndpoint);
// the replay endpoint is always bound. An ipc:// socket file is chmod 0600 right after the bind (a short window
// with the umask's mode; the directory is the operator's); a socket file already at the path (left by a crashed
// run) is replaced, as libzmq does, anything else there fails the bind; Close removes the files it bound. "tcp://*:0" binds an OS-chosen port on every interface
// and Stats().Endpoint reports it (vLLM binds the node IP instead).
//
// Replay framing follows vLLM 0.33.0's _service_replay: a request is exactly 3 frames after the ROUTER's identity
// frame is added ([identity, "", start_seq]); vLLM reads start_seq as a big-endian integer of any length, kvshm
// requires 1..8 bytes. Anything else is counted (BadRequests), ignored, and logged at most once per 10 s
// (with the number suppressed since the last warning). Replies carry the topic frame as
// vLLM's do, so a DEALER receives ["", topic, seq, payload]; Dynamo's listener accepts that (vLLM's shape) and
// ["", seq, payload] (SGLang's). Requests are served one at a time: a replay client that stops reading in the
// middle of its reply holds the replay goroutine (not the live stream) until it reads or disconnects.
//
// # What zmq4 v0.17.0 does (read from its source, pinned by the tests)
//
//   - PUB Send only pushes onto one queue shared by all subscribers and returns; when the queue holds HWM
//     messages the message is dropped silently (HWM 0: the queue is unbounded). So Send never waits for a
//     subscriber, but HWM drops cannot be counted: kvshm counts only its own queue's drops and socket errors.
//   - One goroutine writes that queue to every subscriber in turn, with no write deadline: a subscriber that
//     stops reading (full TCP window) would stall delivery to all subscribers (libzmq keeps a queue per
//     subscriber instead). kvshm's sockets therefore use their own tcp and unix transports (transport.go). A PUB
//     connection gets an outbox of its own, drained by its own goroutine, so zmq4's write to it returns at once
//     and a stuck subscriber never delays the others (TestStuckSubscriberIsCut/backlog; the soak measured 2 s
//     waits before). A subscriber is cut (its connection closed) when it falls more than Config.SubscriberBacklog
//     bytes behind (default 16 MiB) or takes no write for Config.StallTimeout (default 2 s;
//     TestStuckSubscriberIsCut); its libzmq peer reconnects by itself and sees a seq gap, which it can fill from
//     the replay socket. The ROUTER's connections write straight to the socket with the same deadline (its replay
//     goroutine may wait for its one peer). Ingest is never affected (TestStuckSubscriberNeverBlocksPublish).
//   - Its accept loop runs each connection's ZMTP handshake inline with no deadline, and never closes a connection
//     whose handshake failed: one peer that connects and stalls would keep every later peer out, and every peer
//     that sends garbage would leak a file descriptor. kvshm's listener (transport.go) therefore reads each peer's
//     greeting and READY in a goroutine of its own, with the stall timeout as deadline (at most 128 at once), closes
//     the connections that fail, and hands zmq4 only complete handshakes, buffered
//     (TestStalledConnectionsDoNotBlockNewPeers, TestFailedHandshakesAreClosed; found by the soak's zmq scenario).
//   - ROUTER routes a reply by the identity the peer announced in its handshake, or, when it announced none (a
//     libzmq DEALER without ZMQ_IDENTITY, as vLLM's and Dynamo's), by a UUID zmq4 assigns to the connection; so
//     concurrent anonymous replay clients each get their own replies. A reply to a peer that left is dropped.
//
// # Errors
//
// New fails with ErrEndpoint (refused endpoint, nothing opened), ErrBind (bind or chmod failed; the message names
// the endpoint and the errno) or ErrConfig (a negative hwm, buffer_steps, stall timeout or subscriber backlog); on error nothing stays open. After New
// nothing fails: a send error is counted (send_error) and the batch is still kept for replay; a replay send error
// ends that reply. Close is idempotent; Publish after Close drops (closed).
//
// # Concurrency
//
// Publish is called by one goroutine (the stream's drain goroutine); Stats, Config and Close are safe from any
// goroutine. The payload handed to Publish is owned by the publisher from then on.
package zmqpub
