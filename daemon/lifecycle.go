package daemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvshm/kvshm/daemon/internal/stream"
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
		return sock.AttachReply{}, errorf(sock.CodeConflict, "this connection already attached %s; open a new connection", cc.att.Key())
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
			<-old.Done()
			continue
		case attachConflict:
			s.mu.Unlock()
			scope := "scope ALL (no dp_rank: one producer for every rank)"
			if o.key.PerRank {
				scope = fmt.Sprintf("dp_rank %d", o.key.Rank)
			}
			return sock.AttachReply{}, errorf(sock.CodeConflict, "worker %d already has a live producer for %s (pid %d, ring %s); producers that each publish one attention-DP rank with their own seq space must pass dp_rank (LocalIndexer(..., dp_rank=r) or KVSHM_DP_RANK) so each gets its own stream", req.WorkerID, scope, old.Header().ProducerPID, old.RingPath())
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
		if o.key.PerRank {
			s.rankPorts.ensure(o.key.Rank) // per-rank attach: rank r's port (--rank-ports) opens before the reply
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
func (s *Server) attachStateLocked(st *entry, o *openRing) (attachState, *stream.Attachment) {
	in := attachState{closed: s.closed, stream: st != nil, ringEpoch: o.h.Epoch, head: o.head, lookedUp: o.ck != nil,
		interval: s.cfg.CheckpointInterval > 0}
	if o.ck != nil {
		in.restorable, in.moved = o.ck.ix != nil, o.ck.moved
	}
	var old *stream.Attachment
	if st != nil {
		in.streamEpoch, old = st.Epoch()
		if old != nil {
			in.producer = producerLive
			if old.Stopping() {
				in.producer = producerEnding
			}
		}
	}
	return in, old
}

// installPlan is what install does for an outcome that installs an attachment: planInstall's decision, from the
// outcome, the request and the checkpoint lookup; applyInstall carries it out.
type installPlan struct {
	newStream bool         // make the stream (first producer for this key since the daemon started)
	restore   bool         // its index is the restored checkpoint's
	restart   bool         // a new index replaces the stream's (new ring epoch: the producer's cache is empty)
	start     stream.Start // how the attach relates to the producer's incarnation
	taint     string       // the index's history becomes unknown, with this reason ("": it does not)
	// why is the checkpoint's story in the warning of a resume with unknown history.
	why string
}

// installInput is planInstall's input: the outcome and what it depends on.
type installInput struct {
	plan     attachPlan
	head     uint64 // where the stream resumes
	stateDir bool   // --state-dir is set
	ck       *ckptLoad
}

// planInstall decides what install does. It is pure (TestPlanInstall); it panics for an outcome that installs
// nothing (install is called only for the others).
func planInstall(in installInput) installPlan {
	var p installPlan
	switch in.plan.outcome {
	case attachFirst:
		p.newStream, p.start = true, stream.StartBegin
	case attachRestore:
		p.newStream, p.restore, p.start = true, true, stream.StartContinue
	case attachUnknown:
		p.newStream, p.start = true, stream.StartContinue
		p.taint = fmt.Sprintf("daemon resumed ring at head %d: events consumed by an earlier daemon are gone", in.head)
		p.why = "no --state-dir"
		if in.stateDir {
			p.why = "checkpoint not looked up (the stream existed when the attach began)"
		}
		if in.ck != nil {
			p.why = in.ck.why
		}
	case attachReattach:
		p.start = stream.StartReattach
		if in.plan.taint {
			p.taint = fmt.Sprintf("ring resumed at checkpoint head %d, but the checkpoint was not used", in.head)
		}
	case attachRestart:
		p.restart, p.start = true, stream.StartBegin
		if in.plan.taint {
			p.taint = fmt.Sprintf("new ring epoch resumed at head %d", in.head)
		}
	default:
		panic(fmt.Sprintf("install: outcome %s installs nothing", in.plan.outcome))
	}
	return p
}

// install carries out plan p (an outcome that installs an attachment): planInstall decides the steps, applyInstall
// takes them. Called with s.mu held.
func (s *Server) install(cc *conn, st *entry, o *openRing, p attachPlan) (sock.AttachReply, error) {
	ip := planInstall(installInput{plan: p, head: o.head, stateDir: s.cfg.StateDir != "", ck: o.ck})
	return s.applyInstall(cc, st, o, p, ip)
}

// applyInstall takes the steps of ip: the publisher first (a bind failure fails the ATTACH before anything
// changes, but an existing stream's publisher with another config is closed by then; see stream.SetPublisher), the
// stream's index created, restored, kept or replaced, the checkpoint files and their metric, the attachment handed
// to the engine (Stream.Attach), the logs and the reply. Called with s.mu held.
func (s *Server) applyInstall(cc *conn, st *entry, o *openRing, p attachPlan, ip installPlan) (sock.AttachReply, error) {
	req, h, key, head := o.req, o.h, o.key, o.head
	log := s.log.With(key.LogAttrs()...)
	pub := s.streamPublish(req.Publish)
	newIndex := func() (*index.Indexer, error) {
		// The header's max_buffer_size is authoritative (the request's, when nonzero, was checked against it).
		ix, err := index.New(s.indexConfig(req.WorkerID, req.KVBlockSize, h.MaxBufferSize, req.Publish))
		if err != nil {
			return nil, errorf(sock.CodeBadRequest, "create index: %v", err)
		}
		return ix, nil
	}
	var oldEpoch uint64
	switch {
	case ip.newStream:
		var firstPub *zmqpub.Publisher
		if pub != nil {
			var err error
			if firstPub, err = s.eng.OpenPublisher(key, pub); err != nil {
				return sock.AttachReply{}, errorf(sock.CodeBadRequest, "%v", err)
			}
		}
		ix, err := newIndex()
		if err != nil {
			if firstPub != nil {
				_ = firstPub.Close()
			}
			return sock.AttachReply{}, err
		}
		if ip.restore {
			ix = o.ck.ix
		}
		st = &entry{Stream: s.eng.NewStream(key, ix, firstPub, pub), key: key}
		s.streams[key] = st
	default:
		if err := st.SetPublisher(pub); err != nil {
			return sock.AttachReply{}, errorf(sock.CodeBadRequest, "%v", err)
		}
		if ip.restart {
			ix, err := newIndex()
			if err != nil {
				return sock.AttachReply{}, err
			}
			oldEpoch = st.Restart(ix, h.Epoch)
		}
	}
	if p.countRestore {
		s.m.ckptRestores.WithLabelValues(o.ck.result).Inc()
	}
	if p.keepCkpt {
		s.ckpt.removeBut(key, ckptName(key, h.Epoch))
	} else if p.clearCkpts {
		s.ckpt.remove(key)
	}
	a, att, err := st.Attach(stream.AttachSpec{Ring: o.r, Header: h, Head: head, RingPath: req.RingPath,
		BlockSize: req.KVBlockSize, Wire: wireOf(req.Publish), Lease: cc,
		CheckPID: h.ProducerPID != 0 && int32(h.ProducerPID) == cc.pid, Start: ip.start, Restored: ip.restore,
		Taint: ip.taint})
	if err != nil {
		return sock.AttachReply{}, errorf(sock.CodeBusy, "daemon is shutting down")
	}
	switch p.outcome {
	case attachRestore:
		log.Info("resuming a ring from the checkpoint of a gracefully stopped daemon: nothing lost", "head", head, "epoch", h.Epoch)
	case attachUnknown:
		log.Warn("resuming a ring consumed by an earlier daemon: earlier state is unknown until a Cleared", "head", head, "epoch", h.Epoch, "checkpoint", ip.why)
	case attachReattach:
		log.Info("producer reattached the same ring; continuing", "head", head, "epoch", h.Epoch)
	case attachRestart:
		log.Info("producer restarted (new ring epoch): index reset", "old_epoch", oldEpoch, "epoch", h.Epoch, "stream_epoch", att.StreamEpoch)
	}
	cc.att = a
	rep := sock.AttachReply{WorkerID: req.WorkerID, Epoch: h.Epoch, StreamEpoch: att.StreamEpoch, Resumed: p.resumed, Head: head,
		Restored: p.outcome == attachRestore, Batches: true, Publishing: att.Publishing}
	if !a.CheckPID() {
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
	_, a := st.Current()
	if a == nil {
		return nil // already detached: idempotent
	}
	if a.Lease() != io.Closer(cc) {
		// Another client ending a live producer's stream would leave it publishing into a ring nobody reads.
		return errorf(sock.CodeForbidden, "%s is attached by producer pid %d: only the producer detaches it, on its ATTACH "+
			"connection (FORGET drops a worker whose producer is gone)", st.key, a.Header().ProducerPID)
	}
	a.Finish(stream.CauseDetach, "detach requested")
	<-a.Done()
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
		_, a := st.Current()
		if a == nil {
			// Attach installs an attachment only under s.mu, so none can appear before the stream is gone.
			s.dropLocked(st, "stream forgotten: index and metrics dropped")
			return nil
		}
		s.mu.Unlock()
		if !a.Stopping() { // ending: wait for its final drain, then decide again
			return errorf(sock.CodeConflict, "%s has an attached producer (pid %d): it must detach or exit first", st.key, a.Header().ProducerPID)
		}
		select {
		case <-a.Done():
		case <-ctx.Done():
			return errorf(sock.CodeBusy, "%s: the producer's final drain did not finish: %v", st.key, ctx.Err())
		}
	}
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
