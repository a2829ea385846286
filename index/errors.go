package index

import "errors"

// Sentinel errors. Callers match them with errors.Is; the returned errors wrap them with context.
var (
	// ErrZeroBlockSize is returned by New and the hashing functions when the KV block size is 0.
	ErrZeroBlockSize = errors.New("kvshm/index: block size is zero")
	// ErrTokenCount is returned when token bytes are not a multiple of 4 (not u32 tokens); the event is
	// refused and its id counted as lost. A token count that does not match the block count is not an error
	// (ApplyResult.TokenMismatch).
	ErrTokenCount = errors.New("kvshm/index: token bytes are not u32 tokens")
	// ErrBlockHashBytes is returned when the little-endian block hash bytes are not a multiple of 8.
	ErrBlockHashBytes = errors.New("kvshm/index: block hash bytes not a multiple of 8")
	// ErrInvalidKind is returned by Apply for an event kind other than Stored, Removed or Cleared.
	ErrInvalidKind = errors.New("kvshm/index: invalid event kind")
	// ErrParentNotFound is returned when a Stored event names a parent block this (worker, dp_rank) does not
	// hold; nothing of the event is applied (Dynamo's ParentBlockNotFound). The event is still logged.
	ErrParentNotFound = errors.New("kvshm/index: parent block not found")
	// ErrBlockNotFound is returned when a Removed event names a block this (worker, dp_rank) does not hold;
	// the other hashes of the event are still removed (Dynamo's BlockNotFound). The event is still logged.
	ErrBlockNotFound = errors.New("kvshm/index: block not found")
	// ErrInvalidBlockSequence is returned when a Stored event would make a block its own parent or ancestor;
	// the blocks before it stay applied (Dynamo's InvalidBlockSequence). The event is still logged.
	ErrInvalidBlockSequence = errors.New("kvshm/index: invalid block sequence")
	// ErrCheckpoint is returned (wrapped in a *CheckpointError) by ReadCheckpoint when a checkpoint is corrupt,
	// truncated, of another format version or fails its checksum.
	ErrCheckpoint = errors.New("kvshm/index: invalid checkpoint")
)

// Snapshot errors.
var (
	// ErrNoTokens is returned by Snapshot when the index does not keep tokens (Config.KeepTokens).
	ErrNoTokens = errors.New("kvshm/index: the index keeps no tokens")
	// ErrTokensUnknown is returned by TokenSnapshot.Events when a resident block's tokens are unknown (it was
	// applied through Apply, without tokens, or restored from a checkpoint without them).
	ErrTokensUnknown = errors.New("kvshm/index: a block's tokens are unknown")
)
