package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/zmqpub"
)

// Stream lifecycle: attach (validate the ring, plan, install), detach and forget. The outcomes are the tables of
// "Streams and their lifecycle" in doc.go; planAttach is that table as a pure function.

// openRing is a validated, opened ring of an ATTACH request, with the checkpoint lookup made for it.
type openRing struct {
	req  sock.AttachRequest
	key  streamKey
	r    *shm.Reader
	h    shm.Header
	head uint64    // where the stream resumes: the ring's head, or a restorable checkpoint's head ahead of it
	ck   *ckptLoad // the checkpoint lookup (nil when none was made)
}

// attach validates an ATTACH request, opens the ring and starts (or resumes, or replaces) the worker's stream.
func (s *Server) attach(cc *conn, req sock.AttachRequest) (sock.AttachReply, error) {
	if cc.att != nil {
		return sock.AttachReply{}, errorf(sock.CodeConflict, "this connection already attached %s; open a new connection", cc.att.st.key)
	}
	o, err := s.openRing(cc, req)
	if err != nil {
		return sock.AttachReply{}, err
	}
	installed := false
	defer func() {
		if !installed {
			_ = o.r.Close()
		}
	}()
	if err := s.cfg.Bounds.checkAttach(req, o.h.Capacity); err != nil {
		return sock.AttachReply{}, err
	}
	s.lookupCheckpoint(o)
	for {
		s.mu.Lock()
		st := s.streams[o.key]
		in, old := s.attachStateLocked(st, o)
		p := planAttach(in)
		switch p.outcome {
		case attachBusy:
			s.mu.Unlock()
			return sock.AttachReply{}, errorf(sock.CodeBusy, "daemon is shutting down")
		case attachWait: // the previous attachment is ending: wait for its final drain, then decide again
			s.mu.Unlock()
			<-old.done
			continue
		case attachConflict:
			s.mu.Unlock()
			scope := "scope ALL (no dp_rank: one producer for every rank)"
			if o.key.perRank {
				scope = fmt.Sprintf("dp_rank %d", o.key.rank)
			}
			return sock.AttachReply{}, errorf(sock.CodeConflict, "worker %d already has a live producer for %s (pid %d, ring %s); producers that each publish one attention-DP rank with their own seq space must pass dp_rank (LocalIndexer(..., dp_rank=r) or KVSHM_DP_RANK) so each gets its own stream", req.WorkerID, scope, old.hdr.ProducerPID, old.st.ringPath)
		}
		if err := s.peerStreamsLocked(cc); err != nil {
			s.mu.Unlock()
			return sock.AttachReply{}, err
		}
		rep, err := s.install(cc, st, o, p)
		s.mu.Unlock()
		if err != nil {
			return sock.AttachReply{}, err
		}
		installed = true
		if o.key.perRank {
			s.rankPorts.ensure(o.key.rank) // per-rank attach: rank r's port (--rank-ports) opens before the reply
			s.rankPorts.settle()           // (or the opener's, if an ALL stream's event asked for it first)
		}
		return rep, nil
	}
}

// openRing checks the request and the ring file (the validation table of doc.go, in order) and opens the ring.
// Every failure is an error reply and changes nothing.
func (s *Server) openRing(cc *conn, req sock.AttachRequest) (*openRing, error) {
	if req.KVBlockSize == 0 {
		return nil, errorf(sock.CodeBadRequest, "kv_block_size must be > 0")
	}
	if _, err := publishWire(req.Publish); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(req.RingPath) {
		return nil, errorf(sock.CodeBadRequest, "ring_path %q must be absolute", req.RingPath)
	}
	if int(cc.uid) != s.uid {
		return nil, errorf(sock.CodeForbidden, "peer uid %d is not the daemon's uid %d", cc.uid, s.uid)
	}
	// A ring is a regular file, never reached through a symlink, except the producer's own sealed memfd, which
	// it names as /proc/<its pid>/fd/<n> (only its own: the peer's pid comes from SO_PEERCRED).
	stat := os.Lstat
	if ownFDPath(req.RingPath, cc.pid) {
		stat = os.Stat
	}
	fi, err := stat(req.RingPath)
	if err != nil {
		return nil, errorf(sock.CodeNotFound, "ring file: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errorf(sock.CodeForbidden, "ring %s is not a regular file (mode %s)", req.RingPath, fi.Mode())
	}
	sys := fi.Sys().(*syscall.Stat_t)
	if sys.Uid != cc.uid {
		return nil, errorf(sock.CodeForbidden, "ring %s is owned by uid %d, not by the producer's uid %d", req.RingPath, sys.Uid, cc.uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, errorf(sock.CodeForbidden, "ring %s has mode %04o: it must not be group/other writable", req.RingPath, fi.Mode().Perm())
	}
	r, err := shm.Open(req.RingPath)
	if err != nil {
		return nil, errorf(sock.CodeBadRequest, "open ring: %v", err)
	}
	h := r.Header()
	var bad error
	if fi2, err := os.Stat(req.RingPath); err != nil || !os.SameFile(fi, fi2) {
		bad = errorf(sock.CodeConflict, "ring %s was replaced while attaching; retry", req.RingPath)
	} else {
		switch {
		case h.WorkerID != req.WorkerID:
			bad = errorf(sock.CodeBadRequest, "ring header worker_id %d does not match the request's %d", h.WorkerID, req.WorkerID)
		case h.KVBlockSize != req.KVBlockSize:
			bad = errorf(sock.CodeBadRequest, "ring header kv_block_size %d does not match the request's %d", h.KVBlockSize, req.KVBlockSize)
		case req.MaxBufferSize != 0 && h.MaxBufferSize != req.MaxBufferSize:
			bad = errorf(sock.CodeBadRequest, "ring header max_buffer_size %d does not match the request's %d", h.MaxBufferSize, req.MaxBufferSize)
		}
	}
	if bad != nil {
		_ = r.Close()
		return nil, bad
	}
	return &openRing{req: req, key: keyOf(req.WorkerID, req.DpRank), r: r, h: h, head: r.Stats().Head}, nil
}

// lookupCheckpoint looks, for a ring this daemon does not know, for the checkpoint of a gracefully stopped (or,
// with --checkpoint-interval, crashed) daemon. It reads outside s.mu (the file may be large); planAttach decides
// under the lock whether it applies.
func (s *Server) lookupCheckpoint(o *openRing) {
	s.mu.Lock()
	known := s.streams[o.key] != nil
	s.mu.Unlock()
	if s.cfg.StateDir == "" || known {
		return
	}
	// Even at head 0: the first checkpoint of a ring may have been written just before a crash that kept its head
	// from being released. A fresh ring with no checkpoint is not a "missing" restore.
	l := s.ckpt.load(o.key, o.h.Epoch, o.r, s.indexConfig(o.req.WorkerID, o.req.KVBlockSize, o.h.MaxBufferSize, o.req.Publish))
	if o.head > 0 || l.result != ckptMissing {
		o.ck = &l
	}
	if l.ix != nil {
		o.head = l.head
	}
}

// attachState is what planAttach decides from: the daemon, the stream of the key, the ring and the checkpoint
// lookup.
type attachState struct {
	closed      bool // the daemon is shutting down
	stream      bool // the key has a stream
	producer    attProducer
	streamEpoch uint64 // ring epoch the stream last followed (when stream)
	ringEpoch   uint64 // the ring's epoch
	head        uint64 // where the stream would resume (openRing.head)
	lookedUp    bool   // a checkpoint lookup was made and counts (openRing.ck != nil)
	restorable  bool   // the lookup restored an index
	moved       bool   // the lookup moved the reader forward to the checkpoint's head
	interval    bool   // --checkpoint-interval is set
}

// attProducer is the state of a stream's current attachment.
type attProducer uint8

const (
	producerNone   attProducer = iota // no attachment
	producerLive                      // attached and not ending
	producerEnding                    // ending: its final drain is under way
)

// attachOutcome is a row of the outcome table of doc.go ("Streams and their lifecycle").
type attachOutcome uint8

const (
	attachBusy     attachOutcome = iota // the daemon is shutting down: busy
	attachWait                          // the key's previous attachment is ending: wait for it, plan again
	attachConflict                      // a live producer holds the key: conflict
	attachFirst                         // first attach of the stream: a new index
	attachRestore                       // first attach, head > 0, a usable checkpoint: the restored index
	attachUnknown                       // first attach, head > 0, no usable checkpoint: new index, unknown history
	attachReattach                      // same ring epoch: the index continues
	attachRestart                       // new ring epoch (producer restart): the index is replaced
)

var attachOutcomeNames = [...]string{"busy", "wait", "conflict", "first", "restore", "unknown", "reattach", "restart"}

func (o attachOutcome) String() string { return attachOutcomeNames[o] }

// attachPlan is planAttach's decision.
type attachPlan struct {
	outcome attachOutcome
	resumed bool // the reply's resumed: the stream continues at a head > 0 (or the same ring)
	taint   bool // mark the index's history unknown: events before head reach no index
	// countRestore: count the checkpoint lookup's result (kvshm_checkpoint_restores_total).
	countRestore bool
	// keepCkpt: the restored checkpoint stays on disk (--checkpoint-interval: it matches the persisted head until
	// a newer one replaces it); every other checkpoint of the stream is deleted (clearCkpts).
	keepCkpt   bool
	clearCkpts bool
}

// planAttach is the outcome table of an ATTACH that passed validation. It is pure: install carries it out.
func planAttach(in attachState) attachPlan {
	switch {
	case in.closed:
		return attachPlan{outcome: attachBusy}
	case in.producer == producerEnding:
		return attachPlan{outcome: attachWait}
	case in.producer == producerLive:
		return attachPlan{outcome: attachConflict}
	case !in.stream:
		// Any checkpoint of this stream is now consumed (restored) or stale (another epoch, head or content).
		p := attachPlan{countRestore: in.lookedUp, clearCkpts: true}
		switch {
		case in.head > 0 && in.restorable:
			p.outcome, p.resumed, p.keepCkpt = attachRestore, true, in.interval
		case in.head > 0:
			p.outcome, p.resumed, p.taint = attachUnknown, true, true
		default:
			p.outcome = attachFirst
		}
		return p
	case in.ringEpoch == in.streamEpoch:
		// moved: another attach created the stream while this one read a checkpoint ahead of the ring's head, so
		// the records the reader skipped for it reach no index.
		return attachPlan{outcome: attachReattach, resumed: true, taint: in.moved}
	default:
		return attachPlan{outcome: attachRestart, resumed: in.head > 0, taint: in.head > 0, clearCkpts: true}
	}
}

// attachStateLocked gathers planAttach's input, and returns the stream's current attachment. Called with s.mu held.
func (s *Server) attachStateLocked(st *stream, o *openRing) (attachState, *attachment) {
	in := attachState{closed: s.closed, stream: st != nil, ringEpoch: o.h.Epoch, head: o.head, lookedUp: o.ck != nil,
		interval: s.cfg.CheckpointInterval > 0}
	if o.ck != nil {
		in.restorable, in.moved = o.ck.ix != nil, o.ck.moved
	}
	var old *attachment
	if st != nil {
		st.mu.Lock()
		in.streamEpoch = st.epoch
		if old = st.att; old != nil {
			in.producer = producerLive
			select {
			case <-old.stop:
				in.producer = producerEnding
			default:
			}
		}
		st.mu.Unlock()
	}
	return in, old
}

// install carries out plan p (an outcome that installs an attachment): it creates, restores, keeps or replaces the
// stream's index, starts the drain goroutine and returns the reply. Called with s.mu held.
func (s *Server) install(cc *conn, st *stream, o *openRing, p attachPlan) (sock.AttachReply, error) {
	req, h, key, head := o.req, o.h, o.key, o.head
	newIndex := func() (*index.Indexer, error) {
		// The header's max_buffer_size is authoritative (the request's, when nonzero, was checked against it).
		ix, err := index.New(s.indexConfig(req.WorkerID, req.KVBlockSize, h.MaxBufferSize, req.Publish))
		if err != nil {
			return nil, errorf(sock.CodeBadRequest, "create index: %v", err)
		}
		return ix, nil
	}
	log := s.log.With(key.logAttrs()...)
	// The publisher first: a bind failure fails the ATTACH before anything changes (but an existing stream's
	// publisher with another config is closed by then; see setPublisher).
	var firstPub *zmqpub.Publisher
	if st != nil {
		if err := st.setPublisher(req.Publish, s); err != nil {
			return sock.AttachReply{}, err
		}
	} else if req.Publish != nil {
		var err error
		if firstPub, err = zmqpub.New(s.cfg.Bounds.zmqConfig(req.Publish), log); err != nil {
			return sock.AttachReply{}, errorf(sock.CodeBadRequest, "publish: %v", err)
		}
		ps := firstPub.Stats()
		log.Info("ZMQ publishing", "endpoint", ps.Endpoint, "replay_endpoint", ps.ReplayEndpoint, "topic", req.Publish.Topic,
			"hwm", req.Publish.HWM, "buffer_steps", req.Publish.BufferSteps)
	}
	var ix *index.Indexer
	newStream := false
	switch p.outcome {
	case attachFirst, attachRestore, attachUnknown: // first producer for this stream since the daemon started
		newStream = true
		var err error
		if ix, err = newIndex(); err != nil {
			if firstPub != nil {
				_ = firstPub.Close()
			}
			return sock.AttachReply{}, err
		}
		if p.outcome == attachRestore {
			ix = o.ck.ix
		}
		st = &stream{key: key, ix: ix, streamEpoch: 1, groups: map[groupKey]bool{}}
		st.pub.Store(firstPub)
		st.pubWire.Store(uint32(wireOf(req.Publish)))
		st.rank.Store(key.rank)
		st.armReplay(firstPub, req.Publish, s)
		if p.outcome == attachRestore && firstPub != nil {
			// A restored index speaks the previous daemon's wire seqs: never go below them (the clock may have).
			if is := ix.Stats(); is.SeenAny {
				st.wire.Store(is.LastSeenID)
			}
		}
		s.streams[key] = st
	case attachRestart: // producer restarted: its cache is empty
		var err error
		if ix, err = newIndex(); err != nil {
			return sock.AttachReply{}, err
		}
		st.mu.Lock()
		// A new ring epoch ends the previous incarnation first, if its end was not seen (docs/lifecycle.md).
		st.endIncarnationLocked(fmt.Sprintf("new ring epoch %d", h.Epoch), log.Info)
		st.base = addStats(st.base, st.ix.Stats())
		st.ix = ix
		st.streamEpoch++
		st.mu.Unlock()
		st.resets.Add(1)
	case attachReattach: // same producer incarnation reattached: continue the same index
		ix = st.ix
	default:
		panic(fmt.Sprintf("install: outcome %s installs nothing", p.outcome))
	}
	// Before the taints below: a start Cleared would re-base them.
	st.mu.Lock()
	publishing := st.pub.Load() != nil
	// Incarnations (docs/lifecycle.md): one begins with the first attach of a ring epoch the stream has not followed
	// (a fresh ring at head 0 too: the ring holds the whole incarnation), or with a reattach of an epoch whose
	// incarnation was seen to end; a daemon restart (head > 0) continues it. No attachment is installed yet, so
	// this goroutine (holding st.mu) owns the wire counter.
	begins := false
	switch p.outcome {
	case attachFirst, attachRestart:
		begins = true
	case attachReattach:
		begins = !st.live
	case attachRestore, attachUnknown:
		st.live = true
	}
	if publishing && (newStream || begins || st.wire.Load() == 0) {
		st.rebaseWire(s.wireFloor())
	}
	if begins {
		st.live = true
		if publishing {
			id := st.resetIncarnation(st.ix)
			log.Info("producer incarnation began: Cleared published", "id", id, "epoch", h.Epoch)
		}
	}
	st.mu.Unlock()
	if p.countRestore {
		s.m.ckptRestores.WithLabelValues(o.ck.result).Inc()
	}
	if p.keepCkpt {
		s.ckpt.removeBut(key, ckptName(key, h.Epoch))
	} else if p.clearCkpts {
		s.ckpt.remove(key)
	}
	switch p.outcome {
	case attachRestore:
		log.Info("resuming a ring from the checkpoint of a gracefully stopped daemon: nothing lost", "head", head, "epoch", h.Epoch)
	case attachUnknown:
		ix.MarkUnknownHistory(fmt.Sprintf("daemon resumed ring at head %d: events consumed by an earlier daemon are gone", head))
		why := "no --state-dir"
		if s.cfg.StateDir != "" {
			why = "checkpoint not looked up (the stream existed when the attach began)"
		}
		if o.ck != nil {
			why = o.ck.why
		}
		log.Warn("resuming a ring consumed by an earlier daemon: earlier state is unknown until a Cleared", "head", head, "epoch", h.Epoch, "checkpoint", why)
	case attachReattach:
		if p.taint {
			ix.MarkUnknownHistory(fmt.Sprintf("ring resumed at checkpoint head %d, but the checkpoint was not used", head))
		}
		log.Info("producer reattached the same ring; continuing", "head", head, "epoch", h.Epoch)
	case attachRestart:
		if p.taint {
			ix.MarkUnknownHistory(fmt.Sprintf("new ring epoch resumed at head %d", head))
		}
		log.Info("producer restarted (new ring epoch): index reset", "old_epoch", st.epoch, "epoch", h.Epoch, "stream_epoch", st.streamEpoch)
	}
	st.mu.Lock()
	is := st.ix.Stats()
	seqSeen, lastSeq := is.SeenAny, is.LastSeenID
	if publishing { // the index speaks wire seqs; loss bookkeeping needs the engine's
		seqSeen, lastSeq = false, 0
		if p.outcome == attachReattach && !begins {
			seqSeen, lastSeq = st.engSeen, st.engLast
		}
	}
	every := idleEvery
	if publishing {
		every = publishIdleEvery
	}
	now := time.Now()
	a := &attachment{
		st: st, r: o.r, hdr: h, ix: st.ix, log: log, every: every, lease: cc, srv: s,
		publishing: publishing, lastPub: now, lastRec: now, lastSnap: now, lastPID: now,
		ckpt: s.ckpt, rankPorts: &s.rankPorts, pidEvery: s.cfg.PIDCheckInterval,
		checkPID: h.ProducerPID != 0 && int32(h.ProducerPID) == cc.pid,
		stop:     make(chan struct{}), done: make(chan struct{}), syncs: make(chan syncReq, 64),
		ckptEvery: s.cfg.CheckpointInterval, lastCkpt: time.Now(), ckptHead: head, ckptDone: make(chan ckptResult, 1), wireFmt: wireOf(req.Publish),
		seqSeen: seqSeen, lastSeq: lastSeq, ranks: rankSet{on: s.rankPorts.base != 0 && !key.perRank},
	}
	// Handed to a drain worker before any other goroutine can see it (finish and sync use a.h). The worker's
	// first call into it (a pass or Housekeep, which take st.mu) waits until this install releases st.mu.
	if a.checkPID {
		a.pidw = openPIDWatch(int(h.ProducerPID), h.ProducerStartTime)
	} else {
		a.pidw = pidWatch{fd: -1}
	}
	if a.lazy() {
		o.r.SetDoorbellLevel(lazyLevel(h.Capacity))
	}
	lastRing := o.r.Stats() // the last use of the Reader here: the worker owns it from Add on
	hd, err := s.sched.Add(a)
	if err != nil {
		st.mu.Unlock()
		return sock.AttachReply{}, errorf(sock.CodeBusy, "daemon is shutting down")
	}
	a.h = hd
	st.att, st.alive = a, true
	st.blockSize, st.maxBuffer, st.ringPath, st.epoch = req.KVBlockSize, h.MaxBufferSize, req.RingPath, h.Epoch
	st.lastHeader, st.lastRing = h, lastRing
	rep := sock.AttachReply{WorkerID: req.WorkerID, Epoch: h.Epoch, StreamEpoch: st.streamEpoch, Resumed: p.resumed, Head: head,
		Restored: p.outcome == attachRestore, Batches: true, Publishing: publishing}
	st.mu.Unlock()
	cc.att = a
	if !a.checkPID {
		log.Info("producer pid check disabled: the attaching process is not the ring's producer_pid (or another pid namespace)", "peer_pid", cc.pid, "producer_pid", h.ProducerPID)
	}
	log.Info("producer attached", "ring", req.RingPath, "epoch", h.Epoch, "stream_epoch", rep.StreamEpoch, "resumed", p.resumed, "restored", rep.Restored, "head", head, "producer_pid", h.ProducerPID)
	return rep, nil
}

// detach ends the attachment of the stream (worker, rank) (see selectExactLocked) after a final drain; the index
// stays queryable.
func (s *Server) detach(cc *conn, worker uint64, rank *uint32) error {
	s.mu.Lock()
	st, err := s.selectExactLocked(worker, rank)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	_, a := st.current()
	if a == nil {
		return nil // already detached: idempotent
	}
	if a.lease != cc {
		// Another client ending a live producer's stream would leave it publishing into a ring nobody reads.
		return errorf(sock.CodeForbidden, "%s is attached by producer pid %d: only the producer detaches it, on its ATTACH "+
			"connection (FORGET drops a worker whose producer is gone)", st.key, a.hdr.ProducerPID)
	}
	a.finish(causeDetach, "detach requested")
	<-a.done
	return nil
}

// forget drops a stream whose producer is gone (see selectExactLocked): its index, counters and metric series. A
// stream with an attached producer is refused (conflict); one whose attachment is ending is forgotten after the
// final drain.
func (s *Server) forget(ctx context.Context, worker uint64, rank *uint32) error {
	for {
		s.mu.Lock()
		st, err := s.selectExactLocked(worker, rank)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		_, a := st.current()
		if a == nil {
			// Attach installs an attachment only under s.mu, so none can appear before the stream is gone.
			delete(s.streams, st.key)
			s.ckpt.remove(st.key)
			s.mu.Unlock()
			st.mu.Lock()
			st.gone = true // a pid watcher of the stream stops
			st.mu.Unlock()
			st.closePublisher()
			s.m.forgetStream(st.labels())
			s.log.Info("stream forgotten: index and metrics dropped", st.key.logAttrs()...)
			return nil
		}
		s.mu.Unlock()
		select {
		case <-a.stop: // ending: wait for its final drain, then decide again
		default:
			return errorf(sock.CodeConflict, "%s has an attached producer (pid %d): it must detach or exit first", st.key, a.hdr.ProducerPID)
		}
		select {
		case <-a.done:
		case <-ctx.Done():
			return errorf(sock.CodeBusy, "%s: the producer's final drain did not finish: %v", st.key, ctx.Err())
		}
	}
}

// addStats accumulates the cumulative counters of a replaced index.
func addStats(a, b index.Stats) index.Stats {
	for k := range a.Applied {
		for j := range a.Applied[k] {
			a.Applied[k][j] += b.Applied[k][j]
		}
	}
	a.LostIDs += b.LostIDs
	a.Gaps += b.Gaps
	a.Losses += b.Losses
	a.Unknowns += b.Unknowns
	a.IDResets += b.IDResets
	a.Rejected += b.Rejected
	a.DumpBuilds += b.DumpBuilds
	a.DumpCacheHits += b.DumpCacheHits
	a.DumpCacheExtends += b.DumpCacheExtends
	a.DumpErrors += b.DumpErrors
	a.TokenMismatches += b.TokenMismatches
	return a
}

// ownFDPath reports whether path is /proc/<pid>/fd/<n> for the given (peer) pid: a descriptor of the producer
// itself (its memfd ring), which the daemon may open through the link.
func ownFDPath(path string, pid int32) bool {
	rest, ok := strings.CutPrefix(path, "/proc/"+strconv.Itoa(int(pid))+"/fd/")
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.ParseUint(rest, 10, 31)
	return err == nil
}
