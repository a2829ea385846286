package stream

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// ZMQ publishing: BATCH records and the stream's publisher (the index filter: indexfilter.go). See doc.go,
// "Publishing on ZMQ".

// Publish is what an ATTACH asks a stream to publish: its publisher's configuration (the daemon's bounds applied)
// and the vLLM release layout of its batches.
type Publish struct {
	Config zmqpub.Config
	Wire   vllmwire.Wire
}

// ErrPublish is returned when a stream's publisher cannot be opened (the bind failed): the message names the
// endpoint and errno.
var ErrPublish = errors.New("publish")

// OpenPublisher opens the publisher of a stream that does not exist yet (NewStream takes it): a bind failure
// fails the ATTACH before anything changes.
func (e *Engine) OpenPublisher(k Key, p *Publish) (*zmqpub.Publisher, error) {
	log := e.log.With(k.LogAttrs()...)
	pub, err := zmqpub.New(p.Config, log)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPublish, err)
	}
	ps := pub.Stats()
	log.Info("ZMQ publishing", "endpoint", ps.Endpoint, "replay_endpoint", ps.ReplayEndpoint, "topic", p.Config.Topic,
		"hwm", p.Config.HWM, "buffer_steps", p.Config.BufferSteps)
	return pub, nil
}

// SetPublisher gives an existing stream the publisher an ATTACH asks for (nil: none): kept when the config is the
// same, closed when none is asked, replaced (the old one closed first, so the same endpoint can be bound again)
// otherwise. A bind failure is ErrPublish; the stream is then left without publisher. Called before the
// attachment is installed (no drain goroutine runs for the stream), by one ATTACH at a time.
func (st *Stream) SetPublisher(req *Publish) error {
	log := st.eng.log
	old := st.pub.Load()
	if req == nil {
		if old != nil {
			st.closePublisher()
			log.Info("ZMQ publishing stopped: the producer re-attached without publish", st.key.LogAttrs()...)
		}
		return nil
	}
	st.pubWire.Store(uint32(req.Wire))
	cfg := req.Config
	if old != nil && old.Config() == cfg {
		return nil
	}
	if old != nil {
		st.closePublisher()
	}
	p, err := zmqpub.New(cfg, log.With(st.key.LogAttrs()...))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrPublish, err)
	}
	st.pub.Store(p)
	st.armReplay(p, req.Wire)
	ps := p.Stats()
	log.Info("ZMQ publishing", append(st.key.LogAttrs(), "endpoint", ps.Endpoint, "replay_endpoint", ps.ReplayEndpoint,
		"topic", cfg.Topic, "hwm", cfg.HWM, "buffer_steps", cfg.BufferSteps)...)
	return nil
}

// closePublisher closes the stream's publisher, if any, keeping its counters in zmqBase.
func (st *Stream) closePublisher() {
	p := st.pub.Swap(nil)
	if p == nil {
		return
	}
	_ = p.Close()
	ps := p.Stats()
	st.mu.Lock()
	st.zmqBase.AddCounts(ps)
	st.mu.Unlock()
}

// zmqStats returns the cumulative ZMQ counters of the stream (closed publishers included) and whether it is
// publishing now (the endpoints are then the current publisher's).
func (st *Stream) zmqStats() (zmqpub.Stats, bool) {
	p := st.pub.Load()
	st.mu.Lock()
	s := st.zmqBase
	st.mu.Unlock()
	if p == nil {
		return s, false
	}
	ps := p.Stats()
	s.AddCounts(ps)
	s.Endpoint, s.ReplayEndpoint = ps.Endpoint, ps.ReplayEndpoint
	return s, true
}

// errBatch is the cause of a malformed BATCH record beyond shm's layout checks.
var errBatch = errors.New("inconsistent batch")

// batchEvent is one event of a BATCH record, decoded once (pass 1) and applied and encoded from there (pass 2).
type batchEvent struct {
	view    fbs.EventView
	meta    fbs.MetaView
	hasMeta bool
}

// applyBatch handles a BATCH record: it validates every sub-record first (an invalid batch is skipped whole, as a
// malformed record: counted, logged, history marked unknown), then applies the indexable events under one id
// (BeginBatch) and publishes all of them as one vLLM batch.
func (a *Attachment) applyBatch(rec shm.Record, c *batchCounts) {
	b := &a.batch
	if err := rec.ParseBatch(b); err != nil {
		a.malformedRecord(rec.Pos, err)
		return
	}
	// Pass 1: decode and validate every sub-record (FlatBuffers, Meta, one seq and dp_rank) into a.bevs.
	a.bevs = a.bevs[:0]
	pendingMeta := false
	for i, sub := range b.Subs {
		if sub.Type == shm.SubMeta {
			a.bevs = append(a.bevs, batchEvent{})
			e := &a.bevs[len(a.bevs)-1]
			if err := fbs.DecodeMeta(sub.Payload, &e.meta); err != nil {
				a.malformedRecord(rec.Pos, fmt.Errorf("sub-record %d: %w", i, err))
				return
			}
			e.hasMeta, pendingMeta = true, true
			continue
		}
		if !pendingMeta { // ParseBatch guarantees a META is followed by its EVENT
			a.bevs = append(a.bevs, batchEvent{})
		}
		pendingMeta = false
		e := &a.bevs[len(a.bevs)-1]
		if err := fbs.Decode(sub.Payload, &e.view); err != nil {
			a.malformedRecord(rec.Pos, fmt.Errorf("sub-record %d: %w", i, err))
			return
		}
		if e.hasMeta {
			if err := checkHashBytes(&e.view, &e.meta); err != nil {
				a.malformedRecord(rec.Pos, fmt.Errorf("sub-record %d: %w", i, err))
				return
			}
		}
		if first := &a.bevs[0].view; e.view.Seq != first.Seq || e.view.DpRank != first.DpRank {
			a.malformedRecord(rec.Pos, fmt.Errorf("%w: event %d has seq %d dp_rank %d, the batch's first %d/%d",
				errBatch, len(a.bevs)-1, e.view.Seq, e.view.DpRank, first.Seq, first.DpRank))
			return
		}
	}
	seq, rank := a.bevs[0].view.Seq, a.bevs[0].view.DpRank // ParseBatch refuses a batch without events
	// Pass 2: apply and encode, under the batch's wire seq on a publishing stream; a replay snapshot's copy of the
	// tree waits for the whole batch (snapGate).
	a.st.snap.mu.Lock()
	defer a.st.snap.mu.Unlock()
	a.id = seq
	if a.publishing {
		a.id = a.st.nextWire()
	}
	pub := a.st.pub.Load()
	if pub != nil {
		a.wire = vllmwire.AppendBatchHeader(a.wire[:0], batchTS(b.TS), len(a.bevs))
	}
	began := false
	for i := range a.bevs {
		e := &a.bevs[i]
		v := &e.view
		var meta *fbs.MetaView
		if e.hasMeta {
			meta = &e.meta
		}
		why := indexReason(v.Kind, v.DpRank, meta, a.hdr.KVBlockSize, a.st.groups)
		if why == indexed {
			if !began {
				a.ix.BeginBatch(a.id)
				began = true
			}
			a.applyView(v, c)
		} else {
			a.st.notIndexed[why].Add(1)
			a.countReceived(v, c)
		}
		if pub != nil {
			a.wire = a.wireFmt.AppendEvent(a.wire, a.wireEvent(v, meta))
		}
	}
	if pub != nil {
		a.wire = vllmwire.AppendBatchTrailer(a.wire, int64(rank))
		a.handOver(pub, a.id, rank)
	}
}

// handOver gives the encoded batch (of dp_rank rank) to the publisher; a drop (the publisher is closed: FORGET or
// shutdown raced the drain) is logged, rate-limited.
func (a *Attachment) handOver(pub *zmqpub.Publisher, seq uint64, rank uint32) {
	a.pubbed = true
	a.st.rank.Store(rank) // read by heartbeats and Cleared batches (same owner)
	if pub.Publish(seq, append([]byte(nil), a.wire...)) {
		return
	}
	if n, ok := a.st.zmqDropLog.Allow(time.Now()); ok {
		a.log.Warn("ZMQ batch dropped: the stream's publisher is closed",
			"seq", seq, "suppressed", n)
	}
}

// batchTS is the batch's timestamp: the engine's, or the daemon's clock when the engine gave none (0).
func batchTS(ts float64) float64 {
	if ts == 0 {
		return float64(time.Now().UnixNano()) / 1e9
	}
	return ts
}

// publishEvent publishes a single EVENT record as a one-event batch (the single-event decision, docs/decisions.md: medium "GPU", lora_id None,
// block_size the stream's).
func (a *Attachment) publishEvent(v *fbs.EventView) {
	pub := a.st.pub.Load()
	if pub == nil {
		return
	}
	a.wire = vllmwire.AppendBatchHeader(a.wire[:0], batchTS(0), 1)
	a.wire = a.wireFmt.AppendEvent(a.wire, a.wireEvent(v, nil))
	a.wire = vllmwire.AppendBatchTrailer(a.wire, int64(v.DpRank))
	a.handOver(pub, a.id, v.DpRank)
}

// wireEvent fills the attachment's scratch vllmwire.Event from an event and its metadata (nil: the one-event
// batch defaults). The result aliases scratch slices: valid until the next call.
func (a *Attachment) wireEvent(v *fbs.EventView, m *fbs.MetaView) *vllmwire.Event {
	e := &a.wev
	*e = vllmwire.Event{BlockHashes: a.whashes[:0], TokenIDs: a.wtoks[:0]}
	switch v.Kind {
	case fbs.KindStored:
		e.Kind = vllmwire.KindStored
	case fbs.KindRemoved:
		e.Kind = vllmwire.KindRemoved
	default:
		e.Kind = vllmwire.KindCleared
		return e
	}
	for i := range v.NumBlocks() {
		e.BlockHashes = append(e.BlockHashes, v.BlockHash(i))
	}
	a.whashes = e.BlockHashes
	e.HasMedium, e.Medium = true, "GPU"
	e.BlockSize = a.hdr.KVBlockSize
	if m != nil {
		e.HasMedium = m.HasMedium
		if e.Medium = "GPU"; string(m.Medium) != "GPU" {
			e.Medium = string(m.Medium) // a small copy, only for media other than the common one
		}
		e.HasLoraID, e.LoraID = m.HasLoraID, m.LoraID
		if m.HasBlockSize {
			e.BlockSize = m.BlockSize
		}
		e.ExtraKeys = m.ExtraKeys
		e.HasGroupIdx, e.GroupIdx = m.HasGroupIdx, m.GroupIdx
		e.HasKVCacheSpecKind, e.KVCacheSpecKind = m.HasKind, string(m.Kind)
		e.HasSlidingWindow, e.KVCacheSpecSlidingWindow = m.HasSlidingWindow, m.SlidingWindow
		e.HashBytes, e.ParentBytes = m.HashBytes, m.ParentBytes // checked against the keys (checkHashBytes)
		// SGLang's cache_salt and session_id: a copy only when present.
		if m.HasCacheSalt {
			e.HasCacheSalt, e.CacheSalt = true, string(m.CacheSalt)
		}
		if m.HasSessionID {
			e.HasSessionID, e.SessionID = true, string(m.SessionID)
		}
	}
	if v.Kind == fbs.KindStored {
		e.HasParent, e.ParentHash = v.HasParent, v.ParentHash
		for i := range v.NumTokens() {
			e.TokenIDs = append(e.TokenIDs, v.TokenID(i))
		}
		a.wtoks = e.TokenIDs
		e.IsEagle = v.IsEagle
		if len(v.LoraName) > 0 {
			e.HasLoraName, e.LoraName = true, string(v.LoraName)
		}
	}
	return e
}
