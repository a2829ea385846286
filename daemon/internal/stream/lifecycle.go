package stream

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// A stream's lifecycle as the engine carries it out: a stream is made (NewStream), its index replaced at a
// producer restart (Restart), an attachment installed (Attach) and ended (Attachment.Finish), the stream reclaimed
// or forgotten (state.go). Which of these an ATTACH does is the daemon's outcome table (doc.go, "Streams and their
// lifecycle"); how the incarnation and the wire counter start is planStart's.

// ErrClosed is returned by Attach when the drain scheduler is closed (the daemon is shutting down).
var ErrClosed = errors.New("kvshm/daemon/stream: the engine is closed")

// NewStream makes the stream of key k, owning ix, with the publisher pub (nil: not publishing) that
// OpenPublisher opened for p. Its stream_epoch is 1; no attachment feeds it until Attach.
func (e *Engine) NewStream(k Key, ix *index.Indexer, pub *zmqpub.Publisher, p *Publish) *Stream {
	st := &Stream{key: k, eng: e, ix: ix, streamEpoch: 1, groups: map[groupKey]bool{}}
	w := vllmwire.Wire033
	if p != nil {
		w = p.Wire
	}
	st.pub.Store(pub)
	st.pubWire.Store(uint32(w))
	st.rank.Store(k.Rank)
	st.armReplay(pub, w)
	return st
}

// Restart replaces the stream's index with ix for a new ring epoch (a producer restart: its cache is empty),
// ending the previous incarnation first if its end was not seen (docs/lifecycle.md). It returns the ring epoch
// the stream followed before. Called with no attachment installed.
func (st *Stream) Restart(ix *index.Indexer, epoch uint64) (oldEpoch uint64) {
	st.mu.Lock()
	st.endIncarnationLocked(fmt.Sprintf("new ring epoch %d", epoch), st.eng.log.With(st.key.LogAttrs()...).Info)
	st.base = AddStats(st.base, st.ix.Stats())
	st.ix = ix
	st.streamEpoch++
	oldEpoch = st.epoch
	st.mu.Unlock()
	st.resets.Add(1)
	return oldEpoch
}

// Start is how an attachment relates to the producer's incarnation (docs/lifecycle.md, "Incarnations").
type Start uint8

const (
	// StartBegin: the first attach of a ring epoch the stream has not followed (a fresh ring at head 0 too: the
	// ring holds the whole incarnation), or a new ring epoch: an incarnation begins.
	StartBegin Start = iota + 1
	// StartContinue: the first attach of a stream at head > 0 (a daemon restart): the incarnation goes on.
	StartContinue
	// StartReattach: the same ring epoch again: the incarnation goes on, unless its end was seen (then one begins).
	StartReattach
)

// startState is what planStart decides from: the attach and the stream's state under st.mu.
type startState struct {
	start      Start
	restored   bool   // the index was restored from a checkpoint (it speaks the previous daemon's wire seqs)
	publishing bool   // the stream has a publisher
	live       bool   // an incarnation is live (Stream.live)
	wire       uint64 // the last wire seq published (0: none yet)
}

// seqFrom is where an attachment's loss bookkeeping starts (its seqSeen, lastSeq).
type seqFrom uint8

const (
	seqFromIndex    seqFrom = iota // the index's last seen id (it speaks the engine's seqs)
	seqFromNone                    // nothing seen yet (a publishing stream's index speaks wire seqs)
	seqFromPrevious                // the previous attachment's (a publishing stream's reattach, same incarnation)
)

// startPlan is planStart's decision.
type startPlan struct {
	begins bool // an incarnation begins: on a publishing stream its start Cleared is published
	// wireFromIndex: the wire counter continues from the restored index's last id (the clock may have gone back).
	wireFromIndex bool
	rebase        bool    // the wire counter moves up to the clock (wireFloor)
	seqs          seqFrom // where loss bookkeeping starts
	every         time.Duration
}

// planStart decides how an attach starts the stream's incarnation and wire counter; after it the incarnation is
// live in every case. It is pure: Attach gathers its input under st.mu and carries the plan out under the same
// lock.
func planStart(in startState) startPlan {
	p := startPlan{every: IdleEvery, seqs: seqFromIndex}
	switch in.start {
	case StartBegin:
		p.begins = true
	case StartReattach:
		p.begins = !in.live
	}
	if in.publishing {
		p.wireFromIndex = in.restored
		// A stream made for this attach (Begin at head 0, Continue) or a new incarnation starts at the clock at
		// least; a reattach keeps its counter unless it never published.
		p.rebase = in.start != StartReattach || p.begins || in.wire == 0
		p.every = PublishIdleEvery
		p.seqs = seqFromNone
		if in.start == StartReattach && !p.begins {
			p.seqs = seqFromPrevious
		}
	}
	return p
}

// AttachSpec is an ATTACH the daemon validated and decided to install.
type AttachSpec struct {
	Ring     *shm.Reader // the worker owns it from Attach on
	Header   shm.Header  // the ring's header at open
	Head     uint64      // where the stream resumes (the ring's head, or a restored checkpoint's)
	RingPath string
	// BlockSize is the request's kv_block_size (the header's, checked).
	BlockSize uint32
	Wire      vllmwire.Wire // the layout the ATTACH asked to publish in
	// Lease is the producer's ATTACH connection: closed when the ring faults. CheckPID: the header's producer_pid
	// is the attaching peer (same pid namespace), so the pid backstop is armed.
	Lease    io.Closer
	CheckPID bool
	Start    Start
	Restored bool // the stream's index was restored from a checkpoint for this attach
	// Taint, when not "", marks the index's history unknown with this reason, after a start Cleared (which would
	// re-base it).
	Taint string
}

// Attached is what Attach reports for the ATTACH reply and log.
type Attached struct {
	StreamEpoch uint32
	Publishing  bool
}

// Attach installs an attachment of the stream: the incarnation and wire counter as planStart says, the attachment
// handed to a drain worker. Called with no attachment installed (the daemon serializes ATTACHes); ErrClosed when
// the scheduler is closed.
func (st *Stream) Attach(spec AttachSpec) (*Attachment, Attached, error) {
	e := st.eng
	h := spec.Header
	log := e.log.With(st.key.LogAttrs()...)
	st.mu.Lock()
	publishing := st.pub.Load() != nil
	p := planStart(startState{start: spec.Start, restored: spec.Restored, publishing: publishing, live: st.live,
		wire: st.wire.Load()})
	// No attachment is installed yet, so this goroutine (holding st.mu) owns the wire counter (incarnation.go).
	if p.wireFromIndex {
		if is := st.ix.Stats(); is.SeenAny {
			st.wire.Store(is.LastSeenID)
		}
	}
	if p.rebase {
		st.rebaseWire(e.wireFloor())
	}
	st.live = true
	if p.begins && publishing {
		id := st.resetIncarnation(st.ix)
		log.Info("producer incarnation began: Cleared published", "id", id, "epoch", h.Epoch)
	}
	if spec.Taint != "" {
		st.ix.MarkUnknownHistory(spec.Taint)
	}
	var seqSeen bool
	var lastSeq uint64
	switch p.seqs {
	case seqFromIndex:
		is := st.ix.Stats()
		seqSeen, lastSeq = is.SeenAny, is.LastSeenID
	case seqFromPrevious:
		seqSeen, lastSeq = st.engSeen, st.engLast
	}
	now := time.Now()
	a := &Attachment{
		st: st, eng: e, r: spec.Ring, hdr: h, ix: st.ix, log: log, every: p.every, lease: spec.Lease,
		publishing: publishing, lastPub: now, lastRec: now, lastSnap: now, lastPID: now,
		pidEvery: e.cfg.PIDCheckInterval, checkPID: spec.CheckPID,
		stop: make(chan struct{}), done: make(chan struct{}), syncs: make(chan syncReq, 64),
		ckptEvery: e.cfg.CheckpointInterval, lastCkpt: time.Now(), ckptHead: spec.Head, ckptDone: make(chan ckptResult, 1),
		wireFmt: spec.Wire, seqSeen: seqSeen, lastSeq: lastSeq, ranks: rankSet{on: e.cfg.RankPorts && !st.key.PerRank},
	}
	// Handed to a drain worker before any other goroutine can see it (finish and sync use a.h). The worker's
	// first call into it (a pass or Housekeep, which take st.mu) waits until this Attach releases st.mu.
	if a.checkPID {
		a.pidw = e.env.WatchPID(int(h.ProducerPID), h.ProducerStartTime)
	}
	if a.lazy() {
		spec.Ring.SetDoorbellLevel(lazyLevel(h.Capacity))
	}
	lastRing := spec.Ring.Stats() // the last use of the Reader here: the worker owns it from Add on
	hd, err := e.sched.Add(a)
	if err != nil {
		if a.pidw != nil {
			a.pidw.Close()
		}
		st.mu.Unlock()
		return nil, Attached{}, ErrClosed
	}
	a.h = hd
	st.att, st.alive = a, true
	st.blockSize, st.maxBuffer, st.ringPath, st.epoch = spec.BlockSize, h.MaxBufferSize, spec.RingPath, h.Epoch
	st.lastHeader, st.lastRing = h, lastRing
	out := Attached{StreamEpoch: st.streamEpoch, Publishing: publishing}
	st.mu.Unlock()
	return a, out, nil
}

// AddStats accumulates the cumulative counters of a replaced index.
func AddStats(a, b index.Stats) index.Stats {
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
