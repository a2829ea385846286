package daemon

import (
	"fmt"
	"runtime"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/zmqpub"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics is the daemon's Prometheus instrumentation. Per-stream values are read at scrape time by streamCollector
// from counters the drain goroutine keeps (updated once per batch) and from index.Stats, so ingest pays nothing
// per event for metrics. Per-stream series carry worker_id and dp_rank, the stream's scope: the rank of a per-rank
// stream, "" (an absent label to Prometheus) for an ALL stream; so their number is bounded by the streams (a rank
// view of an ALL stream is counted under the ALL stream).
type metrics struct {
	requests        *prometheus.CounterVec   // kvshm_requests_total{transport,kind,code}
	rejected        *prometheus.CounterVec   // kvshm_connections_rejected_total{reason}
	recoveries      *prometheus.CounterVec   // kvshm_recovery_requests_total{worker_id,dp_rank,result}
	recoverySeconds *prometheus.HistogramVec // kvshm_recovery_duration_seconds{worker_id,dp_rank}
	recoveryBytes   *prometheus.HistogramVec // kvshm_recovery_response_bytes{worker_id,dp_rank}
	incomplete      *prometheus.CounterVec   // kvshm_incomplete_answers_total{worker_id,dp_rank}
	ckptWrites      *prometheus.CounterVec   // kvshm_checkpoint_writes_total{result}
	ckptRestores    *prometheus.CounterVec   // kvshm_checkpoint_restores_total{result}
	rankPortErrors  prometheus.Counter       // kvshm_rank_port_errors_total
}

func newMetrics(reg *prometheus.Registry, s *Server) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_requests_total", Help: "Requests served, by transport (socket, http), kind and result code (ok or an error code).",
		}, []string{"transport", "kind", "code"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_connections_rejected_total", Help: "Connections refused or closed by the daemon, by reason (socket: forbidden, busy, limit, idle, frame_timeout, peercred; HTTP: http_busy).",
		}, []string{"reason"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_recovery_requests_total", Help: "Recovery queries (events, dump, /kv_recover) by result (events, tree_dump, too_new, invalid_range, error, failed).",
		}, []string{"worker_id", "dp_rank", "result"}),
		recoverySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvshm_recovery_duration_seconds", Help: "Time to answer a recovery query, including waiting for the drain to catch up and for a dump build.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 4, 12),
		}, []string{"worker_id", "dp_rank"}),
		recoveryBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvshm_recovery_response_bytes", Help: "Size of recovery responses (WorkerKvQueryResponse JSON).",
			Buckets: prometheus.ExponentialBuckets(64, 4, 13),
		}, []string{"worker_id", "dp_rank"}),
		incomplete: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_incomplete_answers_total", Help: "Recovery answers that miss events kvshm lost (--on-loss=best-effort; each also carried the Kvshm-State: incomplete header on HTTP).",
		}, []string{"worker_id", "dp_rank"}),
		rankPortErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvshm_rank_port_errors_total", Help: "Ranks whose --rank-ports listener could not be opened (bind failure, port beyond 65535, listener limit).",
		}),
		ckptWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_checkpoint_writes_total", Help: "Index checkpoints written (--state-dir: at shutdown, and while streams run with --checkpoint-interval), by result (ok, failed).",
		}, []string{"result"}),
		ckptRestores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvshm_checkpoint_restores_total", Help: "Checkpoint lookups when a ring is resumed (--state-dir), by result (restored, missing, stale, corrupt, error).",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "failed"} {
		m.ckptWrites.WithLabelValues(r)
	}
	for _, r := range ckptResults {
		m.ckptRestores.WithLabelValues(r)
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvshm_build_info", Help: "Build information; always 1.",
		ConstLabels: prometheus.Labels{"version": s.cfg.Version, "goversion": runtime.Version()},
	})
	build.Set(1)
	conns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvshm_connections", Help: "Open socket connections (producers and query clients).",
	}, func() float64 { return float64(s.nconns.Load()) })
	rankPorts := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvshm_rank_ports_open", Help: "Open --rank-ports listeners.",
	}, func() float64 { return float64(s.rankPorts.open()) })
	for _, c := range []prometheus.Collector{
		m.requests, m.rejected, m.recoveries, m.recoverySeconds, m.recoveryBytes, m.incomplete, m.ckptWrites, m.ckptRestores,
		m.rankPortErrors, build, conns, rankPorts,
		&streamCollector{s: s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// forgetStream deletes the label-vector series of a forgotten stream (the per-stream collector stops emitting its
// series by itself once the stream is gone).
func (m *metrics) forgetStream(w, r string) {
	l := prometheus.Labels{"worker_id": w, "dp_rank": r}
	m.recoveries.DeletePartialMatch(l)
	m.recoverySeconds.DeletePartialMatch(l)
	m.recoveryBytes.DeletePartialMatch(l)
	m.incomplete.DeletePartialMatch(l)
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"worker_id", "dp_rank"}, labels...), nil)
}

var (
	dStreams         = prometheus.NewDesc("kvshm_streams", "Streams known to the daemon (attached or not).", nil, nil)
	dProducerUp      = desc("kvshm_producer_up", "1 while the stream's producer is attached and alive.")
	dEventsReceived  = desc("kvshm_events_received_total", "Events read from the ring, by type.", "type")
	dBlocksReceived  = desc("kvshm_blocks_received_total", "Blocks carried by events read from the ring, by type.", "type")
	dBlocksApplied   = desc("kvshm_blocks_applied_total", "Blocks of events applied to the index, by type and the event's tree status (a block counts under its event's status; rejected events are not applied).", "type", "status")
	dEventsApplied   = desc("kvshm_events_applied_total", "Events applied to the index, by type and tree status (Dynamo's statuses).", "type", "status")
	dEventsRejected  = desc("kvshm_events_rejected_total", "Events refused as invalid input (token count), counted as lost.")
	dRingUsed        = desc("kvshm_ring_used_bytes", "Bytes published and not yet consumed in the stream's ring.")
	dRingCapacity    = desc("kvshm_ring_capacity_bytes", "Data capacity of the stream's ring.")
	dRingDropped     = desc("kvshm_ring_dropped_events_total", "Events the producer dropped (ring full or record too large); from the ring header, restarts with a new ring.")
	dRingDroppedB    = desc("kvshm_ring_dropped_bytes_total", "Bytes of events the producer dropped; from the ring header, restarts with a new ring.")
	dLostEvents      = desc("kvshm_lost_events_total", "Event ids known lost (producer loss reports and id gaps).")
	dSeqGaps         = desc("kvshm_seq_gaps_total", "Gaps detected in event ids.")
	dIDResets        = desc("kvshm_event_id_resets_total", "Backwards or duplicate event ids (the log restarted).")
	dUnknownHistory  = desc("kvshm_unknown_history_total", "Times the stream's earlier state became unknown (daemon resumed a ring, ring corruption, malformed event).")
	dStreamResets    = desc("kvshm_stream_resets_total", "Producer restarts with a new ring epoch (index reset).")
	dStreamEpoch     = desc("kvshm_stream_epoch", "Stream epoch: 1 at the first attach, +1 per reset.")
	dTainted         = desc("kvshm_stream_tainted", "1 while lost or unknown history is not re-based by a Cleared (answers that need it are incomplete, or Error with --on-loss=error).")
	dTokenMismatch   = desc("kvshm_token_count_mismatch_total", "Stored events whose token count was not blocks × block_size (hashed as Dynamo does: complete windows, zipped with the block hashes).")
	dResidentBlocks  = desc("kvshm_resident_blocks", "Blocks resident in the index (dp_rank, block hash entries).")
	dBuffered        = desc("kvshm_buffered_events", "Events buffered in the recovery log.")
	dOldestID        = desc("kvshm_oldest_event_id", "Oldest event id in the recovery log (absent when empty).")
	dNewestID        = desc("kvshm_newest_event_id", "Newest event id in the recovery log (absent when empty).")
	dDumpBuilds      = desc("kvshm_dump_builds_total", "Tree dumps built.")
	dDumpCacheHits   = desc("kvshm_dump_cache_hits_total", "Dumps answered from the dump cache.")
	dCorruptRecords  = desc("kvshm_ring_corrupt_records_total", "Corrupt ring records (the daemon skipped to the tail).")
	dMalformedEvents = desc("kvshm_malformed_events_total", "Ring records whose FlatBuffer event failed validation.")
	dLossRecords     = desc("kvshm_loss_records_total", "Loss records the producer wrote after the ring had been full.")
	dDrainBatches    = desc("kvshm_drain_batches_total", "Drain batches (one head store each).")
	dNotIndexed      = desc("kvshm_events_not_indexed_total", "Events published on ZMQ but not applied to the index (not device-tier main attention), by reason (medium, kv_cache_spec_kind, group_idx, block_size).", "reason")
	dZmqPublished    = desc("kvshm_zmq_published_batches_total", "Batches handed to the stream's ZMQ PUB socket.")
	dZmqDropped      = desc("kvshm_zmq_dropped_batches_total", "Batches not published on ZMQ, by reason (closed: published after the stream's publisher closed; queue_full and send_error are no longer produced, kept as stable labels).", "reason")
	dZmqReplayReqs   = desc("kvshm_zmq_replay_requests_total", "Replay requests served on the stream's ZMQ ROUTER socket.")
	dZmqBadReplay    = desc("kvshm_zmq_bad_replay_requests_total", "Replay requests that were not [identity, \"\", start seq]: ignored, unanswered, logged at most every 10 s.")
	dZmqReplayed     = desc("kvshm_zmq_replayed_batches_total", "Batches sent in answer to replay requests.")
	dZmqIncomplete   = desc("kvshm_zmq_replay_incomplete_total", "Replay replies that could not hold everything from the requested seq (the replay buffer rolled over, or kvshmd restarted since the engine incarnation began).")
	dZmqCut          = desc("kvshm_zmq_subscribers_cut_total", "ZMQ subscribers disconnected for falling behind (16 MiB or hwm messages queued) or taking no write for the stall timeout.")
	dZmqSnapshots    = desc("kvshm_zmq_snapshots_total", "Replay replies the buffer could not answer completely, by how their snapshot came (built; shared: a cached or concurrent build; waited: built after waiting for a --zmq-snapshot-builds slot; unavailable: none, the reply held the buffer only). docs/replay-snapshots.md.", "outcome")
	dZmqPeersCut     = desc("kvshm_zmq_peers_cut_total", "Peers of the stream's ZMQ PUB and replay sockets cut for a bound (their connection closed, or refused at accept), by reason; zmqpub/doc.go names each bound and reason.", "reason")
	dZmqReplayCut    = desc("kvshm_zmq_replay_clients_cut_total", "Replay clients disconnected for taking no write for the stall timeout.")
	dZmqFilled       = desc("kvshm_zmq_replay_filled_batches_total", "Empty batches replay replies carried to keep their seqs contiguous (--zmq-replay-fill; docs/replay-snapshots.md).")
	dZmqJoins        = desc("kvshm_zmq_late_joins_total", "Subscribers that joined a restarted daemon's PUB within the join window and were first given the batches it had published (zmqpub/doc.go, \"Late joiners\").")
	dZmqJoined       = desc("kvshm_zmq_late_joined_batches_total", "Batches given to late joiners before the live ones.")
	dZmqGapped       = desc("kvshm_zmq_replay_gapped_total", "Replay replies that kept a seq gap although --zmq-replay-fill is on: incomplete with no snapshot, or more fillers needed than it allows.")
)

var kindLabels = [3]string{"stored", "removed", "cleared"}

// streamCollector emits per-stream metrics at scrape time.
type streamCollector struct{ s *Server }

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dStreams, dProducerUp, dEventsReceived, dBlocksReceived, dEventsApplied, dBlocksApplied,
		dEventsRejected, dRingUsed, dRingCapacity, dRingDropped, dRingDroppedB, dLostEvents, dSeqGaps, dIDResets,
		dUnknownHistory, dStreamResets, dStreamEpoch, dTainted, dResidentBlocks, dBuffered, dOldestID, dNewestID,
		dDumpBuilds, dDumpCacheHits, dCorruptRecords, dMalformedEvents, dLossRecords, dDrainBatches, dTokenMismatch,
		dNotIndexed, dZmqPublished, dZmqDropped, dZmqReplayReqs, dZmqBadReplay, dZmqReplayed,
		dZmqIncomplete, dZmqCut, dZmqReplayCut, dZmqSnapshots, dZmqFilled, dZmqGapped, dZmqJoins, dZmqJoined} {
		ch <- d
	}
}

func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	list := c.s.streamList()
	ch <- prometheus.MustNewConstMetric(dStreams, prometheus.GaugeValue, float64(len(list)))
	const C, G = prometheus.CounterValue, prometheus.GaugeValue
	for _, st := range list {
		w, r := st.labels()
		ss := st.Status()
		cur := ss.Index.Stats()
		is := stream.AddStats(ss.Base, cur)
		rs, alive, epoch := ss.Ring, ss.Alive, ss.StreamEpoch
		emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, lv ...string) {
			ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{w, r}, lv...)...)
		}
		emit(dProducerUp, G, b2f(alive))
		for k, name := range kindLabels {
			emit(dEventsReceived, C, float64(ss.EventsRecv[k]), name)
			emit(dBlocksReceived, C, float64(ss.BlocksRecv[k]), name)
			for j := range is.Applied[k] {
				emit(dEventsApplied, C, float64(is.Applied[k][j]), name, statusName(j))
				emit(dBlocksApplied, C, float64(ss.BlocksAppl[k][j]), name, statusName(j))
			}
		}
		emit(dEventsRejected, C, float64(is.Rejected))
		emit(dRingUsed, G, float64(rs.Used))
		emit(dRingCapacity, G, float64(rs.Capacity))
		emit(dRingDropped, C, float64(rs.DroppedEvents))
		emit(dRingDroppedB, C, float64(rs.DroppedBytes))
		emit(dLostEvents, C, float64(is.LostIDs))
		emit(dSeqGaps, C, float64(is.Gaps))
		emit(dIDResets, C, float64(is.IDResets))
		emit(dUnknownHistory, C, float64(is.Unknowns))
		emit(dStreamResets, C, float64(ss.Resets))
		emit(dStreamEpoch, G, float64(epoch))
		emit(dTainted, G, b2f(cur.Tainted))
		emit(dResidentBlocks, G, float64(cur.ResidentBlocks))
		emit(dBuffered, G, float64(cur.Buffered))
		if cur.Buffered > 0 {
			emit(dOldestID, G, float64(cur.FirstEventID))
			emit(dNewestID, G, float64(cur.LastEventID))
		}
		emit(dDumpBuilds, C, float64(is.DumpBuilds))
		emit(dDumpCacheHits, C, float64(is.DumpCacheHits))
		emit(dCorruptRecords, C, float64(ss.Corrupt))
		emit(dMalformedEvents, C, float64(ss.Malformed))
		emit(dLossRecords, C, float64(ss.LossRecords))
		emit(dDrainBatches, C, float64(ss.Batches))
		emit(dTokenMismatch, C, float64(is.TokenMismatches))
		for i, reason := range stream.NotIndexedLabels {
			emit(dNotIndexed, C, float64(ss.NotIndexed[i]), reason)
		}
		if zs, on := st.ZMQStats(); on || zs.Published != 0 || zs.DroppedTotal() != 0 || zs.ReplayRequests != 0 ||
			zs.BadRequests != 0 {
			emit(dZmqPublished, C, float64(zs.Published))
			for i, reason := range zmqpub.DropReasons {
				emit(dZmqDropped, C, float64(zs.Dropped[i]), reason)
			}
			emit(dZmqReplayReqs, C, float64(zs.ReplayRequests))
			emit(dZmqBadReplay, C, float64(zs.BadRequests))
			emit(dZmqReplayed, C, float64(zs.Replayed))
			emit(dZmqIncomplete, C, float64(zs.ReplayIncomplete))
			emit(dZmqCut, C, float64(zs.Cut))
			emit(dZmqReplayCut, C, float64(zs.ReplayCut))
			for i, reason := range zmqpub.CutReasons {
				emit(dZmqPeersCut, C, float64(zs.PeersCut[i]), reason)
			}
			emit(dZmqFilled, C, float64(zs.ReplayFilled))
			emit(dZmqGapped, C, float64(zs.ReplayGapped))
			emit(dZmqJoins, C, float64(zs.Joins))
			emit(dZmqJoined, C, float64(zs.JoinedBatches))
			for i, outcome := range zmqpub.SnapshotOutcomes {
				emit(dZmqSnapshots, C, float64(zs.Snapshots[i]), outcome)
			}
		}
	}
}

func statusName(j int) string { return index.Status(j).String() }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// slogAdapter routes promhttp's error log to slog.
type slogAdapter struct{ s *Server }

func (a slogAdapter) Println(v ...any) { a.s.log.Error("metrics", "err", fmt.Sprint(v...)) }
