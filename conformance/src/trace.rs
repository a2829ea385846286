//! The trace format (contract "Trace format") and the one conversion of a trace op into
//! the `RouterEvent` Dynamo 1.6.1 would index.
//!
//! Every path that turns producer input into an event goes through [`stored_event`],
//! [`removed_event`] or [`cleared_event`]: the Python `LocalIndexer`, the `replay` binary
//! and the consumer's live path. Token ids become `LocalBlockHash`es with 1.6.1's own
//! `compute_block_hash_for_seq` over the whole token list (complete windows only; a window
//! is `block_size` tokens, `block_size + 1` for Eagle, advancing by `block_size`), paired
//! zip-style with the engine's block hashes: the shorter list decides how many blocks are
//! stored, so a short token list never panics (the old extension did) and a long one is cut.

use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, RouterEvent, compute_block_hash_for_seq,
};
use serde::{Deserialize, Deserializer, Serialize};

use crate::Error;

/// An engine block hash as the trace (or Python) gives it: a u64, or a signed i64 that
/// is reinterpreted bit for bit (two's complement), as `ExternalSequenceBlockHash::from(i64)` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Hash(pub u64);

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            U(u64),
            I(i64),
        }
        Ok(match Either::deserialize(d)? {
            Either::U(u) => Hash(u),
            Either::I(i) => Hash(i as u64),
        })
    }
}

/// Line 1 of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub trace: String,
    pub worker_id: u64,
    pub block_size: u32,
    pub max_buffer_size: usize,
}

/// One op line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Stored {
        seq: u64,
        #[serde(default)]
        dp_rank: u32,
        tokens: Vec<u32>,
        hashes: Vec<Hash>,
        #[serde(default)]
        parent: Option<Hash>,
        #[serde(default)]
        lora_name: Option<String>,
        #[serde(default)]
        is_eagle: Option<bool>,
    },
    Removed {
        seq: u64,
        #[serde(default)]
        dp_rank: u32,
        hashes: Vec<Hash>,
    },
    Cleared {
        seq: u64,
        #[serde(default)]
        dp_rank: u32,
    },
    Query {
        start: Option<u64>,
        end: Option<u64>,
        #[serde(default)]
        answer: Option<serde_json::Value>,
    },
}

impl Op {
    /// Parse one op line.
    pub fn parse(line: &str) -> Result<Self, Error> {
        serde_json::from_str(line).map_err(|e| Error::BadOp(e.to_string()))
    }

    /// The event this op feeds an indexer (None for a query). `worker_id` and `block_size`
    /// come from the trace header (or the consumer's registration).
    pub fn event(&self, worker_id: u64, block_size: u32) -> Option<RouterEvent> {
        match self {
            Op::Stored {
                seq,
                dp_rank,
                tokens,
                hashes,
                parent,
                lora_name,
                is_eagle,
            } => Some(stored_event(
                worker_id,
                *seq,
                *dp_rank,
                &StoredInput {
                    block_size,
                    tokens,
                    hashes: &hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
                    parent: parent.map(|h| h.0),
                    lora_name: lora_name.as_deref(),
                    is_eagle: *is_eagle,
                },
            )),
            Op::Removed {
                seq,
                dp_rank,
                hashes,
            } => Some(removed_event(
                worker_id,
                *seq,
                *dp_rank,
                &hashes.iter().map(|h| h.0).collect::<Vec<_>>(),
            )),
            Op::Cleared { seq, dp_rank } => Some(cleared_event(worker_id, *seq, *dp_rank)),
            Op::Query { .. } => None,
        }
    }
}

/// What an `apply_stored` call carries besides its ids.
#[derive(Debug, Clone, Copy)]
pub struct StoredInput<'a> {
    pub block_size: u32,
    pub tokens: &'a [u32],
    pub hashes: &'a [u64],
    pub parent: Option<u64>,
    pub lora_name: Option<&'a str>,
    pub is_eagle: Option<bool>,
}

/// The blocks of a Stored event: 1.6.1's tokens hashes of the complete windows, zipped
/// with the engine's block hashes (the shorter of the two decides the count).
pub fn stored_blocks(input: &StoredInput<'_>) -> Vec<KvCacheStoredBlockData> {
    let tokens_hashes = compute_block_hash_for_seq(
        input.tokens,
        input.block_size,
        BlockHashOptions {
            lora_name: input.lora_name,
            is_eagle: input.is_eagle,
            ..Default::default()
        },
    );
    tokens_hashes
        .into_iter()
        .zip(input.hashes)
        .map(|(tokens_hash, &block_hash)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(block_hash),
            tokens_hash,
            mm_extra_info: None,
        })
        .collect()
}

/// `RouterEvent::new` (device tier, worker residency) around a Stored event with `event_id = seq`.
pub fn stored_event(
    worker_id: u64,
    seq: u64,
    dp_rank: u32,
    input: &StoredInput<'_>,
) -> RouterEvent {
    RouterEvent::new(
        worker_id,
        KvCacheEvent {
            event_id: seq,
            data: KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: input.parent.map(ExternalSequenceBlockHash),
                start_position: None,
                blocks: stored_blocks(input),
            }),
            dp_rank,
        },
    )
}

/// A Removed event with `event_id = seq`.
pub fn removed_event(worker_id: u64, seq: u64, dp_rank: u32, hashes: &[u64]) -> RouterEvent {
    RouterEvent::new(
        worker_id,
        KvCacheEvent {
            event_id: seq,
            data: KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: hashes
                    .iter()
                    .copied()
                    .map(ExternalSequenceBlockHash)
                    .collect(),
            }),
            dp_rank,
        },
    )
}

/// A Cleared event with `event_id = seq`.
pub fn cleared_event(worker_id: u64, seq: u64, dp_rank: u32) -> RouterEvent {
    RouterEvent::new(
        worker_id,
        KvCacheEvent {
            event_id: seq,
            data: KvCacheEventData::Cleared,
            dp_rank,
        },
    )
}
