//! kvshm's conformance harness around the real `dynamo-kv-router` 1.6.1 (crates.io).
//!
//! Four parts, one conversion ([`trace`]):
//! - [`reference::Reference`]: 1.6.1's `LocalKvIndexer` behind a synchronous API, the
//!   reference kvshm is checked against (the `replay` binary and the Python `LocalIndexer`).
//! - [`consumer::Consumer`]: a port of deepinfra's global-indexer consumer on 1.6.1's own
//!   `RadixTree`, to check that kvshm's answers rebuild the state a live listener has.
//! - [`wire`]: a `/kv_recover` body parsed with 1.6.1's types and with the older b2b7868 ones.
//! - [`judge::StandaloneJudge`]: 1.6.1's standalone indexer (`WorkerRegistry`, its ZMQ listeners
//!   with gap detection and replay, its indexer) consuming a real engine-side ZMQ publisher.
//!
//! # Python API (module `kvshm_conformance`, built with maturin; stub: `kvshm_conformance.pyi`)
//!
//! ```text
//! LocalIndexer(worker_id: int, kv_block_size: int, max_buffer_size: int = 10000)
//!     The old extension's API over 1.6.1's LocalKvIndexer. kv_block_size == 0 raises RuntimeError.
//!   .apply_stored(seq, token_ids, block_hashes, parent_hash=None, dp_rank=0, lora_name=None, is_eagle=None) -> None
//!     tokens hashed by 1.6.1 over complete windows, zipped with block_hashes (shorter wins).
//!     Hashes are ints in [-2**63, 2**64): negatives are taken as two's complement u64.
//!   .apply_removed(seq, block_hashes, dp_rank=0) -> None
//!   .apply_cleared(seq, dp_rank=0) -> None
//!     apply_* raise RuntimeError only after shutdown() (IndexerOffline), like the old extension.
//!   .get_events_json(start=None, end=None) -> str     WorkerKvQueryResponse JSON, 1.6.1's serde output
//!   .shutdown() -> None                                idempotent
//! Consumer(kv_block_size: int | None = None)
//!   .observe(worker_id, dp_rank, seq) -> str           "initial" | "contiguous" | "gap" | "stale"
//!   .apply_live(worker_id, dp_rank, op_json, kv_block_size=None) -> str
//!     one trace op line (stored/removed/cleared) applied under (worker_id, dp_rank) unless
//!     stale; returns the observation. A stored op needs a block size (argument or constructor)
//!     else ValueError; a malformed op raises ValueError.
//!   .apply_live_batch(worker_id, dp_rank, seq, ops_json: list[str], kv_block_size=None) -> str
//!     one ZMQ batch (ops sharing seq) as 1.6.1's listener applies it: all unless seq is stale; ValueError on
//!     an op of another seq (nothing applied)
//!   .apply_recovery(worker_id, dp_rank, response_json) -> str   the variant name; ValueError if unparsable
//!   .watermark(worker_id, dp_rank) -> int | None
//!   .state() -> str                                    canonical JSON (see consumer module doc)
//!   .find_matches(tokens_hashes: list[int]) -> list[tuple[int, int, int]]   (worker_id, dp_rank, score)
//! StandaloneJudge(threads: int = 1)       1.6.1's standalone indexer (see the judge module doc)
//!   .register(worker_id, dp_rank, endpoint, replay_endpoint, block_size) -> None   POST /register
//!   .pause(worker_id, dp_rank) / .resume(worker_id, dp_rank) -> None               /test/{pause,resume}_listener
//!   .workers_json() -> str        GET /workers
//!   .dump_json() -> str           the indexer's dump_events() (GET /dump's events)
//!   .state() -> str               {tier: canonical state} (consumer module doc)
//!   .find_matches(tokens_hashes) -> list[tuple[int, int, int]]   device tier
//!   .log() -> list[tuple[str, str, dict[str, str]]]             its listeners' INFO/WARN lines
//!     register/pause/resume raise ValueError for what 1.6.1 refuses; state/find_matches RuntimeError
//!     when the indexer fails.
//! parse_response(json: str, types: str) -> str
//!     types "1.6.1" or "b2b7868"; returns the body re-serialized from those types;
//!     ValueError when it does not parse (or types is unknown).
//! ```
//!
//! # Building and testing
//!
//! ```text
//! cd conformance
//! CARGO_TARGET_DIR=/work/cargo-target cargo test --release --locked    # Rust tests, no Python needed
//! cargo run --release --locked --bin replay < trace.jsonl > answered.jsonl
//! pip install -r requirements.txt && maturin build --release --locked -o ../build/confwheel
//! pip install ../build/confwheel/kvshm_conformance-*.whl && pytest tests/test_module.py
//! ```
//!
//! Errors: every fallible call returns [`Error`]; Python maps `BadOp`, `Parse` and
//! `BadArgument` to `ValueError`, `Indexer` and `Runtime` to `RuntimeError`.

pub mod consumer;
pub mod judge;
pub mod reference;
pub mod trace;
pub mod wire;

#[cfg(feature = "python")]
mod python;

use std::fmt;

/// Every error of this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A trace op line that is not valid JSON of the trace format, or the wrong kind of op.
    BadOp(String),
    /// A `/kv_recover` body that the chosen types do not parse.
    Parse(String),
    /// An argument out of range (block size 0, unknown types name).
    BadArgument(String),
    /// The indexer refused an event (`IndexerOffline` after shutdown).
    Indexer(String),
    /// The tokio runtime could not be built, or serialization failed.
    Runtime(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadOp(m) => write!(f, "kvshm-conformance: bad trace op: {m}"),
            Error::Parse(m) => write!(f, "kvshm-conformance: parse response: {m}"),
            Error::BadArgument(m) => write!(f, "kvshm-conformance: {m}"),
            Error::Indexer(m) => write!(f, "kvshm-conformance: indexer: {m}"),
            Error::Runtime(m) => write!(f, "kvshm-conformance: {m}"),
        }
    }
}

impl std::error::Error for Error {}
