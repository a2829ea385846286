package index

import "fmt"

// Config configures one Indexer: the index of one worker (all of its dp_ranks).
type Config struct {
	// WorkerID is stamped on every RouterEvent the index emits.
	WorkerID uint64
	// BlockSize is the KV block size in tokens; it must not be 0.
	BlockSize uint32
	// MaxBufferSize is the number of events the log keeps (Dynamo's max_buffer_size); 0 keeps none.
	MaxBufferSize int
	// OnLoss says how answers that miss events kvshm lost are given (default LossBestEffort).
	OnLoss LossPolicy
	// DumpShape is the event shape of a TreeDump (default DumpChains, Dynamo 1.6.1).
	DumpShape DumpShape
	// KeepTokens keeps every resident block's token window (and LoRA name) so that Snapshot can describe the
	// tree as vLLM BlockStored events (tokens.go, snapshot.go): (block_size+2)*4 bytes per node.
	KeepTokens bool
}

// LossPolicy says what a recovery answer is when kvshm itself lost events (a LOSS record, unknown history, a
// refused event) that the answer would have to include.
type LossPolicy uint8

// Loss policies.
const (
	// LossBestEffort (the default) answers what Dynamo would answer from the events the index did apply, and
	// marks the Response Incomplete with the lost ranges.
	LossBestEffort LossPolicy = iota
	// LossError answers the Error variant naming the loss (until a Cleared re-bases the tree).
	LossError
)

func (p LossPolicy) String() string {
	switch p {
	case LossBestEffort:
		return "best-effort"
	case LossError:
		return "error"
	}
	return fmt.Sprintf("LossPolicy(%d)", uint8(p))
}

// DumpShape is the shape of the events of a TreeDump.
type DumpShape uint8

// Dump shapes.
const (
	// DumpChains (the default) writes the tree as Dynamo 1.6.1's dump_tree_as_events does: merged chains
	// (multi-block Stored events with parent_hash), "reset_scope" in the TreeDump, "residency_domain" in each
	// RouterEvent.
	DumpChains DumpShape = iota
	// DumpBlocks writes the older shape (upstream b2b7868): one single-block Stored event per (block,
	// dp_rank), breadth-first, and no reset_scope or residency_domain fields anywhere.
	DumpBlocks
)

func (s DumpShape) String() string {
	switch s {
	case DumpChains:
		return "chains"
	case DumpBlocks:
		return "blocks"
	}
	return fmt.Sprintf("DumpShape(%d)", uint8(s))
}

// Kind is the kind of a KV event. The values equal the FlatBuffers union tags (kvevent.EventData).
type Kind uint8

// Event kinds.
const (
	KindStored  Kind = 1
	KindRemoved Kind = 2
	KindCleared Kind = 3
)

func (k Kind) String() string {
	switch k {
	case KindStored:
		return "stored"
	case KindRemoved:
		return "removed"
	case KindCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Block is one stored block: the engine's block hash and the tokens hash (Dynamo's LocalBlockHash).
type Block struct {
	BlockHash, TokensHash uint64
}

// Event is one KV event with its tokens already hashed. Slices are borrowed: Apply copies what it keeps.
type Event struct {
	ID        uint64
	DpRank    uint32
	Kind      Kind
	HasParent bool
	Parent    uint64
	Blocks    []Block  // KindStored
	Hashes    []uint64 // KindRemoved
}

// Status is the outcome of applying an event to the radix tree (Dynamo's KvCacheEventError, or OK).
type Status uint8

// Apply statuses, used as the second index of Stats.Applied.
const (
	StatusOK Status = iota
	StatusParentNotFound
	StatusBlockNotFound
	StatusInvalidBlockSequence
	NumStatuses
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusParentNotFound:
		return "parent_not_found"
	case StatusBlockNotFound:
		return "block_not_found"
	case StatusInvalidBlockSequence:
		return "invalid_block_sequence"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// ApplyResult says what applying one event did to the log and the tree.
type ApplyResult struct {
	// Status is the tree outcome; a non-OK status is also returned as an error wrapping the matching sentinel.
	Status Status
	// Gap is true when the event's id skipped ids: ids the producer never handed over, not a loss (1.6.1).
	Gap bool
	// IDReset is true when the event's id was not greater than the last id: the log restarted at it.
	IDReset bool
	// TokenMismatch is true when a Stored event's token count was not what its block count implies
	// (blocks × block_size, +1 for Eagle); the event was applied as Dynamo applies it (see the package doc).
	TokenMismatch bool
}

// RespKind is the variant of a WorkerKvQueryResponse.
type RespKind uint8

// Response variants.
const (
	RespEvents RespKind = iota + 1
	RespTreeDump
	RespTooNew
	RespInvalidRange
	RespError
)

func (k RespKind) String() string {
	switch k {
	case RespEvents:
		return "Events"
	case RespTreeDump:
		return "TreeDump"
	case RespTooNew:
		return "TooNew"
	case RespInvalidRange:
		return "InvalidRange"
	case RespError:
		return "Error"
	}
	return fmt.Sprintf("RespKind(%d)", uint8(k))
}

// Response is the answer to a recovery query.
type Response struct {
	Kind RespKind
	// JSON is the complete WorkerKvQueryResponse. It may be shared with other callers (a cached dump):
	// treat it as read-only.
	JSON []byte
	// LastEventID is last_event_id (Events, TreeDump) or newest_available (TooNew).
	LastEventID uint64
	// NumEvents is the number of RouterEvents in Events or TreeDump.
	NumEvents int
	// CacheHit is true when a TreeDump came from (or extended) the dump cache.
	CacheHit bool
	// Incomplete is true when the answer misses events kvshm lost (LossBestEffort only; under LossError such
	// an answer is the Error variant).
	Incomplete bool
	// Lost are those losses, the newest MaxLostRanges (set when Incomplete). Owned by the caller.
	Lost []LostRange
}

// Score is the number of leading blocks of a sequence that a (worker, dp_rank) holds.
type Score struct {
	WorkerID uint64
	DpRank   uint32
	Blocks   uint32
}

// LostRange is a range of event ids the index never applied (inclusive). Unknown marks a point where the
// history is unknown (MarkUnknownHistory); then First is the first id after that point and First-1 the last id
// seen before it (First == Last+1), or First == Last == 0 when it lies before every event.
type LostRange struct {
	First, Last uint64
	Unknown     bool
	Reason      string
}

// Stats is a consistent copy of the index's counters.
type Stats struct {
	WorkerID      uint64
	BlockSize     uint32
	MaxBufferSize int

	// Buffered is the number of events in the log; FirstEventID and LastEventID are valid when it is > 0.
	Buffered     int
	FirstEventID uint64
	LastEventID  uint64
	// SeenAny is true once an event or loss was recorded; LastSeenID is then the highest id seen or lost in the
	// current numbering.
	SeenAny    bool
	LastSeenID uint64

	// ResidentBlocks is Dynamo's current_size: the number of (dp_rank, block hash) lookup entries.
	ResidentBlocks int
	// Nodes is the number of live tree nodes (including unheld nodes kept for reuse).
	Nodes   int
	DpRanks []uint32

	// Tainted is true while a loss or unknown history has not been re-based by a Cleared: dumps are
	// incomplete (LossBestEffort) or answer Error (LossError). Incomplete is the same value under the name the
	// daemon reports.
	Tainted     bool
	Incomplete  bool
	TaintReason string
	// LostRanges are the recent lost ranges of the current numbering (at most MaxLostRanges, merged beyond).
	LostRanges []LostRange
	// Missing are the losses since the last Cleared, what an incomplete dump misses (the Response.Lost of a
	// TreeDump), including unknown history before the first event; empty when not Tainted.
	Missing  []LostRange
	LostIDs  uint64 // total ids lost (MarkLost and refused events)
	Gaps     uint64 // gaps in event ids (not losses)
	Losses   uint64 // MarkLost calls
	Unknowns uint64 // MarkUnknownHistory calls
	IDResets uint64 // backwards or duplicate ids (log restarted)
	Rejected uint64 // events refused as invalid input (not applied, counted as lost)
	// TokenMismatches counts Stored events whose token count did not match their block count (applied).
	TokenMismatches uint64

	// Applied counts applied events by kind (index Kind-1) and tree status.
	Applied [3][NumStatuses]uint64

	DumpBuilds       uint64 // tree dumps built
	DumpCacheHits    uint64 // dumps answered from the cache unchanged
	DumpCacheExtends uint64 // dumps answered by extending the cache with the log tail
	DumpErrors       uint64 // dumps refused (Error) because the index is tainted
}

// MaxLostRanges bounds Stats.LostRanges and the ranges the index remembers; older ranges are merged.
const MaxLostRanges = 32
