package stream

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvshm/kvshm/daemon/internal/ratelog"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/zmqpub"
)

// Drain loop tuning.
const (
	maxBatch       = 256                    // records per Release
	SnapshotPeriod = 100 * time.Millisecond // ring stats refresh while idle
)

// Stream is the state of one (worker, scope): its index (kept across producer deaths) and the current attachment,
// if any.
type Stream struct {
	key Key     // immutable
	eng *Engine // immutable

	// Rate limits of the warn lines about token-count mismatches and dropped batches. Safe for concurrent use.
	mismatchLog, zmqDropLog ratelog.Log

	// Counters updated by the drain goroutine once per batch. Updated atomically.
	eventsRecv  [3]atomic.Uint64 // by kind-1
	blocksRecv  [3]atomic.Uint64
	blocksAppl  [3][index.NumStatuses]atomic.Uint64 // blocks of applied events, by kind-1 and tree status
	corrupt     atomic.Uint64
	malformed   atomic.Uint64
	batches     atomic.Uint64
	resets      atomic.Uint64
	lossRecords atomic.Uint64
	notIndexed  [NumNotIndexed]atomic.Uint64 // events published but not indexed (the device-tree filter), by reason

	// pub is the stream's ZMQ publisher (nil: not publishing). Stored by NewStream and SetPublisher (one ATTACH at a time, no drain goroutine
	// running), Forget and ClosePublisher; loaded by the drain goroutine once per record. Updated atomically.
	pub atomic.Pointer[zmqpub.Publisher]
	// pubWire is the vllmwire.Wire of the last ATTACH that asked to publish (the incarnation Cleared's layout, which
	// resetIncarnation publishes after that attachment may be gone). Stored with pub by ATTACH.
	pubWire atomic.Uint32
	// groups are the KV-cache group kinds learned from the stream's events (indexReason). Owned by the current
	// attachment's drain goroutine (attachments of a stream run one after the other).
	groups map[groupKey]bool
	// wire is the last wire seq published on the stream (0: none yet; docs/lifecycle.md, "Wire seqs"), rank the dp_rank
	// of its last published batch (heartbeats and Cleared batches carry it). Owned as incarnation.go says: the
	// current attachment's drain goroutine, or the holder of mu while no attachment is installed. Updated
	// atomically (readers: STATS, tests).
	wire atomic.Uint64
	rank atomic.Uint32
	// snap keeps a replay snapshot's tree copy between two batches (snapshot.go).
	snap snapGate

	mu          sync.Mutex // protects every field below
	ix          *index.Indexer
	base        index.Stats // cumulative counters of indexes replaced by resets
	blockSize   uint32
	maxBuffer   uint32
	ringPath    string
	epoch       uint64
	streamEpoch uint32
	att         *Attachment // nil when no producer is attached
	lastRing    shm.RingStats
	lastHeader  shm.Header
	alive       bool         // producer believed alive (attached and not seen dead)
	zmqBase     zmqpub.Stats // counters of the stream's closed publishers
	// live: an incarnation of the ring epoch in epoch has started and has not been seen to end (incarnation.go).
	live bool
	// engSeen, engLast: the last engine seq the previous attachment applied, for a publishing stream (whose index
	// speaks wire seqs): the next attachment's loss bookkeeping continues from it.
	engSeen bool
	engLast uint64
	gone    bool // forgotten (FORGET, the reaper): a pid watcher stops
	// The reaper's view (Dead): deadSince is when the last attachment ended (Env.Mono), watchers the pid watches
	// following a producer whose connection broke while it lived (the stream is not dead while one runs).
	deadSince int64
	watchers  int
}
