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
// that falls behind is cut instead, see Bounds; DropQueueFull is no longer produced, a stable metric label);
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
// # Late joiners (join.go)
//
// On a publisher that began in the middle of an engine incarnation (its first batch, heartbeats aside, was not a
// reset batch: a restarted daemon's), a subscriber whose subscriptions first match the topic within
// Config.JoinWindow (DefaultJoinWindow, 5 s) of New is given the batches the replay buffer holds (batches and reset
// batches, in seq order, as PUB messages; not the heartbeats, which are never kept: their seqs are missing, and a
// consumer that checks seqs asks the replay socket, whose filler answers them) and then the live ones: both are
// handed to it under the publish lock, so no live batch comes before them and none is missed between them. What
// one joiner is given is bounded (Bounds): the newest batches, at most maxJoinBatches (1024), half its backlog in
// bytes and half its Config.HWM in messages, so its own join never cuts it; a subscriber that cancels and
// subscribes again is not given them twice. Subscribers already subscribed are not held back: a join hands its
// messages to the joiner as Publish does (a non-blocking writev at most, the rest queued for its writer
// goroutine), and a Publish meanwhile waits for it at most the building of ~1,024 headers; the engine and the ring
// never wait for it.
//
// Why: PUB/SUB as libzmq has it loses what is published before a subscriber's connection is back (the slow
// joiner). A daemon SIGKILLed and restarted rebinds a stream's PUB when the engine reattaches and publishes what
// the engine writes at once; dynamo.vllm's relay SUB, following the stream since before the restart, is back about
// 100 ms later (libzmq's reconnect interval), and in Dynamo 1.6.1 it has no replay: without the join, those batches
// were lost for Dynamo's router (e2e/dynamo/README.md). Its subscribers were following the stream: the join gives
// them back its continuity, and a replaying consumer (Dynamo's standalone indexer, llm-d) that gets a batch it
// already has (a reconnect within the window) drops it: its seq is at or below its watermark.
//
// Why not at every bind: a fresh incarnation's stream starts with its reset batch (docs/lifecycle.md), before
// anyone can follow it, and there PUB/SUB stays as vLLM's own publisher has it (a late subscriber gets the live
// batches only): its consumers are built for that slow joiner (dynamo.vllm's relay subscribes before the worker
// registers, so the engine serves nothing it could miss; the others replay), and a consumer that takes its first
// live seq as its start (kvshm's plugins' own tests do) would otherwise see seqs below it. A restarted daemon's
// stream that ends its incarnation within the window (the engine died) keeps joining: the buffer then starts with
// that reset batch, so a joiner gets the Cleared its consumer must apply. Stats.Joins and Stats.JoinedBatches count
// the joins and what they were given (kvshmd: kvshm_zmq_late_joins_total, kvshm_zmq_late_joined_batches_total).
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
// 10 s (with the number suppressed since the last warning); a message of more than 16 frames cuts its client
// (Bounds). Replies carry the topic frame as vLLM's do, so a DEALER receives ["", topic, seq, payload]; Dynamo's
// listener accepts that (vLLM's shape) and ["", seq, payload] (SGLang's). Each client connection is its own peer
// (no identities are needed to route replies); its requests are answered in order.
//
// ZMTP commands are not requests: a libzmq peer with ZMQ_HEARTBEAT_IVL sends PING (Dynamo 1.6.1's replay DEALER and
// SUB: every 5 s, timeout and TTL 15 s) and drops the connection when nothing comes back within the timeout. Both
// sockets answer PING with PONG (echoing its context) and ignore other commands. (zmq4's ROUTER, used before, handed
// a PING on as a 2-frame message: kvshmd logged "invalid zmq replay request: ignored frames=2" every 5 s and never
// answered; zmq4's PUB stopped reading a subscriber after its 10th PING, subscriptions included.)
//
// # Bounds (every one a peer meets, what going past it does, its test)
//
// The sockets face the cluster network without authentication (vLLM's convention is tcp://*:5557), so every byte
// a remote peer can make kvshmd hold is counted against a bound per connection, and each connection against its
// remote address's share; a peer past a bound is cut (its connection closed), never the daemon, and counted in
// Stats.PeersCut by reason (CutReasons; kvshmd: kvshm_zmq_peers_cut_total{reason}). Every connection has a queue
// and a writer goroutine of its own; a write by Publish never waits (non-blocking, only when the queue is empty),
// the writer's waits at most Config.StallTimeout (default 2 s). So one peer that stops reading costs only its own
// queue and never delays another peer.
//
//	what a peer does                                   what happens (reason)                  tested by
//	a subscriber's queue past Config.SubscriberBacklog cut; it reconnects by itself and        TestStuckSubscriber*
//	bytes (default 16 MiB) or Config.HWM messages      replays the seq gap (backlog); libzmq
//	(0: no message bound)                              drops past its HWM instead
//	the queues of its address's connections past       the connection a message would take    TestAddrBacklog
//	Config.AddrBacklog bytes together (default 4       over is cut (addr_backlog); a reply
//	subscriber backlogs)                               waits for its own queue first
//	a write blocked for the stall timeout              cut (stalled)                          TestStuckReplayClients*
//	a PING whose context is over 16 bytes (ZMTP 3.1)   cut, as libzmq does (ping)             TestPingContextBound
//	PINGs faster than it reads PONGs                   one PONG held at most: a PING while    TestPingFloodHoldsOnePong
//	                                                   one waits is answered by it
//	a SUBSCRIBE of one more than 1024 held             cut (subscriptions)                    TestSubscriptionFloodIsCut
//	a replay request of more than 16 frames            cut, counted BadRequests (request)     TestLongRequestIsCut
//	a subscription within a restarted daemon's join    given the newest buffered batches:     TestJoinBounds,
//	window (each connection once)                      at most 1024, half its backlog and     TestJoinersThatNever*
//	                                                   half its HWM; its address's backlog
//	                                                   cuts past it (addr_backlog)
//	a frame over 64 KiB, bad frame flags, a malformed  cut (protocol)                         FuzzZMTPDecoders
//	command
//	a connection from an address (IPv4; IPv6: its /64) closed at accept (addr_conns)         TestConnsPerAddress
//	that holds Config.ConnsPerAddr (default 64;
//	kvshmd --zmq-conns-per-addr), handshakes included
//	a connection while 128 handshakes are under way    closed at accept (handshakes)          TestStalledConnections*
//	a connection that finishes its handshake while the closed after its handshake (conns)    TestConnsPerAddress
//	socket holds 1024
//	a handshake not done within the stall timeout,     closed (not counted: never a peer)     TestFailedHandshakes*
//	garbage, a wrong socket type
//
// What a peer's connection holds, then: during its handshake, its READY (at most 64 KiB; at most 128 handshakes
// under way); after it, its queue (the bounds above; the payloads in it are the publisher's, shared by every queue
// and the replay buffer, never copied), one PONG, a 4 KiB read buffer, and of what it sends only what
// the reader needs: a frame is read into at most 1 + 255 (a command's name) + len(topic) + 1 bytes on the PUB, or a
// request's 8-byte seq on the replay socket, the rest discarded as it arrives (readPrefix). So an unfinished
// request pins nothing however many and large its frames (before, a body was allocated whole from its header: 200
// clients holding 15 frames of 60 KiB pinned 180 MiB), and a subscriber's subscriptions are a set as libzmq's PUB
// keeps them (a repeated SUBSCRIBE changes nothing, one CANCEL removes it; before, kvshm counted repeats): a
// publisher has one topic, so one that can match is kept as the length of the topic's prefix it is, any other as a
// hash, at most 1024 in all (SUBSCRIBE and CANCEL cost O(their length); before, every change rescanned a map of
// every topic: 40,000 took 10 s of CPU).
// With the per-address share, what one address can make a socket hold is its share of connections times that,
// its queues together bounded by Config.AddrBacklog.
//
// Replies: a replay client's reply is paced by its own queue (SubscriberBacklog bytes: the reply goroutine waits
// for room, so a large reply is never cut for its size); a client whose write blocks for the stall timeout is cut
// (Stats.ReplayCut). 8 clients that request the whole buffer and never read leave a healthy client's replay
// unaffected (TestStuckReplayClientsCostOnlyThemselves; with zmq4's ROUTER they denied it for 40-60 s).
//
// The per-address share is what keeps one host from denying another: 1,100 idle connections from one address
// (handshakes done, a topic that never matches) leave every other address's room (before, they took the socket's
// 1,024 and locked every router out). A router on the same host as an attacker shares that host's address and so
// its share: the attacker can hold all of it and the router is closed at accept (counted addr_conns) until the
// attacker's connections end; on kvshmd's own node, the router can use the ipc:// endpoint instead (0600: only the
// daemon's user reaches it; ipc sockets have no per-address share, only the socket's 1,024). Enough distinct
// addresses (1024 / the share; 16 at the default) can still fill a socket: the share bounds what one host takes,
// not a distributed flood (a firewall's job).
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
// the endpoint and the errno) or ErrConfig (a negative hwm, buffer_steps, buffer bytes, stall timeout, subscriber
// backlog or connections per address); on error nothing stays open. After New nothing fails: a subscriber or a
// replay client that cannot be written to, or goes past a bound, is cut and counted. Close hands what is queued to
// the subscribers' queues and gives them at most 1 s (or the stall timeout, if shorter) to be written; it is
// idempotent; Publish after Close drops (closed).
//
// # Concurrency
//
// Publish, PublishHeartbeat and PublishReset are called by one goroutine at a time (the stream's drain goroutine or
// the daemon's lifecycle code, ordered by the stream), and pay the writes to the subscribers that keep up (a writev
// of a few KiB each); Flush, Stats, Config and Close are safe from any goroutine.
// The payload handed to Publish is owned by the publisher from then on.
package zmqpub
