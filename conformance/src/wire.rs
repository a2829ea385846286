//! Parsing a `/kv_recover` body with two generations of Dynamo's types:
//! - `"1.6.1"`: `dynamo_kv_router::indexer::WorkerKvQueryResponse` itself (serde defaults
//!   for `reset_scope`, `residency_domain`, `storage_tier`, `dp_rank`, ...).
//! - `"b2b7868"`: this module's own copy of the older types the old extension pinned
//!   (upstream rev b2b7868): `RouterEvent {worker_id, storage_tier, event}` without
//!   `residency_domain`, `TreeDump {events, last_event_id}` without `reset_scope`, and only
//!   the serde defaults that revision had (`storage_tier`, `dp_rank`, `start_position`,
//!   `mm_extra_info`). Unknown fields are ignored (serde's default), so a 1.6.1 body parses
//!   as long as every field the old types require is present.
//!
//! [`parse_response`] returns the body re-serialized from the parsed types: what a
//! consumer on those types would see (fields it does not know are gone, defaults filled).

use dynamo_kv_router::indexer::WorkerKvQueryResponse;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Parse with 1.6.1's `WorkerKvQueryResponse`.
pub fn parse_v161(body: &str) -> Result<WorkerKvQueryResponse, Error> {
    serde_json::from_str(body).map_err(|e| Error::Parse(format!("1.6.1 types: {e}")))
}

/// Parse with the b2b7868 types.
pub fn parse_b2b7868(body: &str) -> Result<old::WorkerKvQueryResponse, Error> {
    serde_json::from_str(body).map_err(|e| Error::Parse(format!("b2b7868 types: {e}")))
}

/// Parse `body` with the named generation of types (`"1.6.1"` or `"b2b7868"`) and return it
/// re-serialized from those types.
pub fn parse_response(body: &str, types: &str) -> Result<String, Error> {
    let out = match types {
        "1.6.1" => serde_json::to_string(&parse_v161(body)?),
        "b2b7868" => serde_json::to_string(&parse_b2b7868(body)?),
        other => {
            return Err(Error::BadArgument(format!(
                "unknown types {other:?} (want \"1.6.1\" or \"b2b7868\")"
            )));
        }
    };
    out.map_err(|e| Error::Runtime(format!("re-serialize: {e}")))
}

/// The wire types of upstream Dynamo at rev b2b7868 (fields in declaration order).
pub mod old {
    use super::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub enum WorkerKvQueryResponse {
        Events {
            events: Vec<RouterEvent>,
            last_event_id: u64,
        },
        TreeDump {
            events: Vec<RouterEvent>,
            last_event_id: u64,
        },
        TooNew {
            requested_start: Option<u64>,
            requested_end: Option<u64>,
            newest_available: u64,
        },
        InvalidRange {
            start_id: u64,
            end_id: u64,
        },
        Error(String),
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct RouterEvent {
        pub worker_id: u64,
        #[serde(default)]
        pub storage_tier: StorageTier,
        pub event: KvCacheEvent,
    }

    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum StorageTier {
        #[default]
        Device,
        HostPinned,
        Disk,
        External,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct KvCacheEvent {
        pub event_id: u64,
        pub data: KvCacheEventData,
        #[serde(default)]
        pub dp_rank: u32,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum KvCacheEventData {
        Stored(KvCacheStoreData),
        Removed(KvCacheRemoveData),
        Cleared,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct KvCacheStoreData {
        pub parent_hash: Option<u64>,
        #[serde(default)]
        pub start_position: Option<u32>,
        pub blocks: Vec<KvCacheStoredBlockData>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct KvCacheStoredBlockData {
        pub block_hash: u64,
        pub tokens_hash: u64,
        #[serde(default)]
        pub mm_extra_info: Option<BlockExtraInfo>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct BlockExtraInfo {
        pub mm_objects: Vec<BlockMmObjectInfo>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct BlockMmObjectInfo {
        pub mm_hash: u64,
        pub offsets: Vec<(usize, usize)>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct KvCacheRemoveData {
        pub block_hashes: Vec<u64>,
    }
}
