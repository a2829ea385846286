//! A port of deepinfra's global-indexer consumer (`services/indexer/kv_recover.rs`
//! `plan_recovery` and `listener.rs`), built only on Dynamo 1.6.1's own types, cursor and
//! single-threaded `RadixTree`.
//!
//! One `Consumer` holds one tree for every `(worker_id, dp_rank)` it listens to, and one
//! watermark (1.6.1's `CursorState`) per `(worker_id, dp_rank)`:
//! - **Live** ([`Consumer::apply_live`]): an op whose seq is not newer than the watermark is
//!   stale and dropped; otherwise it is converted by [`crate::trace`] (the one conversion)
//!   under the listener's `(worker_id, dp_rank)`, applied, and the watermark becomes its seq.
//!   Gap recovery is the caller's move: [`Consumer::observe`] says what the listener would
//!   see (`gap` → ask `/kv_recover?start=expected&end=got`, then apply the live op).
//! - **Recovery** ([`Consumer::apply_recovery`]): `Events` → every event rewritten to the
//!   consumer's `(worker_id, dp_rank)`, applied, watermark = `last_event_id`. `TreeDump`
//!   with `reset_scope` all (or absent) → `remove_worker_dp_rank`, then the same; a
//!   domain-scoped TreeDump is applied without the reset (as deepinfra does).
//!   `StateAgentRecovery` → its inner response. `TooNew`, `InvalidRange`, `Error`,
//!   `TreeDumpFailed`, `Status` → nothing at all.
//! - Simplification: deepinfra routes events by `storage_tier` to lower-tier indexers; this
//!   port has the device tree only and applies every event to it (kvshm and the producers
//!   modelled here publish device-tier events only).
//!
//! **Canonical state** ([`Consumer::state`]): the tree's own `dump_tree_as_events`, read
//! back into, per `(worker_id, dp_rank)`, the sorted list of resident blocks, each as
//! `[path, block_hash]` where `path` is the list of `LocalBlockHash`es from the root to the
//! block (inclusive). The path set decides routing (`find_matches` scores are prefix depths
//! along paths); the `block_hash` at each path decides which later `Removed(h)` and
//! `parent_hash = h` resolve: 1.6.1's tree resolves both through the hashes of the edge
//! positions the worker covers (`edge_index` + `covers_pos`), which are exactly the blocks
//! the dump emits for that worker; a lookup entry left behind for another hash resolves to
//! nothing (`BlockNotFound` / `ParentBlockNotFound`), as for an absent hash. So two
//! consumers with equal state strings answer every later match and resolve every later
//! event alike. (Caveat: one engine hash at two tree positions gets its children's paths
//! from the first position the dump shows. Cost: O(blocks × depth), meant for
//! conformance-sized trees.) The JSON is
//! `{"workers":[{"worker_id":W,"dp_rank":R,"blocks":[[[t1,t2,..],h],..]},..]}`, workers
//! sorted by `(worker_id, dp_rank)`, blocks sorted by path then hash, no whitespace.
//! A block whose parent edge belongs to no worker (a dangling subtree the tree still keeps)
//! has a path starting with the JSON string `"?<parent block hash>"`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::indexer::WorkerKvQueryResponse;
use dynamo_kv_router::protocols::{
    KvCacheEventData, LocalBlockHash, ResetScope, RouterEvent, WorkerWithDpRank,
};
use dynamo_kv_router::recovery::{CursorObservation, CursorState};
use serde::Serialize;

use crate::Error;
use crate::trace::Op;

/// What the live listener sees for one seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// First seq of this `(worker, dp_rank)`; the listener recovers `[0, got)` when `got > 0`.
    Initial {
        got: u64,
    },
    Contiguous {
        got: u64,
    },
    /// Seqs `expected..got` are missing.
    Gap {
        expected: u64,
        got: u64,
    },
    /// Not newer than the watermark: dropped.
    Stale {
        got: u64,
    },
}

impl Observation {
    pub fn name(&self) -> &'static str {
        match self {
            Observation::Initial { .. } => "initial",
            Observation::Contiguous { .. } => "contiguous",
            Observation::Gap { .. } => "gap",
            Observation::Stale { .. } => "stale",
        }
    }
}

/// The consumer: one 1.6.1 `RadixTree` and a watermark per `(worker_id, dp_rank)`.
#[derive(Default)]
pub struct Consumer {
    tree: RadixTree,
    cursors: BTreeMap<(u64, u32), u64>,
}

/// One block of the canonical state: its path of tokens hashes and its block hash.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
enum PathStep {
    Hash(u64),
    Dangling(String),
}

#[derive(Serialize)]
struct WorkerState {
    worker_id: u64,
    dp_rank: u32,
    blocks: Vec<(Vec<PathStep>, u64)>,
}

#[derive(Serialize)]
struct State {
    workers: Vec<WorkerState>,
}

impl Consumer {
    pub fn new() -> Self {
        Self::default()
    }

    fn cursor(&self, worker_id: u64, dp_rank: u32) -> CursorState {
        match self.cursors.get(&(worker_id, dp_rank)) {
            Some(&w) => CursorState::Live(w),
            None => CursorState::Initial,
        }
    }

    /// What the listener of `(worker_id, dp_rank)` would see for a live `seq`.
    pub fn observe(&self, worker_id: u64, dp_rank: u32, seq: u64) -> Observation {
        match self.cursor(worker_id, dp_rank).observe(seq) {
            CursorObservation::Initial { got } => Observation::Initial { got },
            CursorObservation::Contiguous { got } => Observation::Contiguous { got },
            CursorObservation::Gap { expected, got } => Observation::Gap { expected, got },
            CursorObservation::Stale { got, .. } => Observation::Stale { got },
        }
    }

    /// The watermark of `(worker_id, dp_rank)` (None before the first event or recovery).
    pub fn watermark(&self, worker_id: u64, dp_rank: u32) -> Option<u64> {
        self.cursors.get(&(worker_id, dp_rank)).copied()
    }

    /// Apply one live trace op as the listener of `(worker_id, dp_rank)` would: a stale seq
    /// is dropped, anything else is applied (tree rejections are ignored, as the listener's
    /// indexer only counts them) and becomes the watermark. Returns what was observed.
    pub fn apply_live(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        block_size: u32,
        op: &Op,
    ) -> Result<Observation, Error> {
        let Some(mut event) = op.event(worker_id, block_size) else {
            return Err(Error::BadOp("a query op is not a live event".into()));
        };
        let seq = event.event.event_id;
        let observation = self.observe(worker_id, dp_rank, seq);
        if let Observation::Stale { .. } = observation {
            return Ok(observation);
        }
        event.event.dp_rank = dp_rank;
        let _ = self.tree.apply_event(event);
        self.cursors.insert((worker_id, dp_rank), seq);
        Ok(observation)
    }

    /// Apply one live batch (events sharing one seq: a ZMQ batch, as 1.6.1's listener applies
    /// it): a stale seq drops the whole batch, else every event is applied in order under
    /// `(worker_id, dp_rank)` and the seq becomes the watermark. An empty batch only moves
    /// the watermark. Ops with different seqs are a [`Error::BadOp`] (nothing applied).
    pub fn apply_live_batch(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        block_size: u32,
        seq: u64,
        ops: &[Op],
    ) -> Result<Observation, Error> {
        let mut events = Vec::with_capacity(ops.len());
        for op in ops {
            let Some(mut event) = op.event(worker_id, block_size) else {
                return Err(Error::BadOp("a query op is not a live event".into()));
            };
            if event.event.event_id != seq {
                return Err(Error::BadOp(format!(
                    "an op with seq {} in the batch of seq {seq}",
                    event.event.event_id
                )));
            }
            event.event.dp_rank = dp_rank;
            events.push(event);
        }
        let observation = self.observe(worker_id, dp_rank, seq);
        if let Observation::Stale { .. } = observation {
            return Ok(observation);
        }
        for event in events {
            let _ = self.tree.apply_event(event);
        }
        self.cursors.insert((worker_id, dp_rank), seq);
        Ok(observation)
    }

    /// Apply a `/kv_recover` answer for `(worker_id, dp_rank)` exactly as deepinfra's
    /// `plan_recovery` + `recover_over_http` do. Returns the variant name.
    pub fn apply_recovery(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        response: WorkerKvQueryResponse,
    ) -> &'static str {
        let rewrite = |events: Vec<RouterEvent>| {
            events.into_iter().map(move |mut e| {
                e.worker_id = worker_id;
                e.event.dp_rank = dp_rank;
                e
            })
        };
        match response {
            WorkerKvQueryResponse::Events {
                events,
                last_event_id,
            } => {
                for event in rewrite(events) {
                    let _ = self.tree.apply_event(event);
                }
                self.cursors.insert((worker_id, dp_rank), last_event_id);
                "Events"
            }
            WorkerKvQueryResponse::TreeDump {
                events,
                last_event_id,
                reset_scope,
            } => {
                if matches!(reset_scope, ResetScope::All) {
                    self.tree.remove_worker_dp_rank(worker_id, dp_rank);
                }
                for event in rewrite(events) {
                    let _ = self.tree.apply_event(event);
                }
                self.cursors.insert((worker_id, dp_rank), last_event_id);
                "TreeDump"
            }
            WorkerKvQueryResponse::StateAgentRecovery { response, .. } => {
                self.apply_recovery(worker_id, dp_rank, *response)
            }
            WorkerKvQueryResponse::TooNew { .. } => "TooNew",
            WorkerKvQueryResponse::InvalidRange { .. } => "InvalidRange",
            WorkerKvQueryResponse::Error(_) => "Error",
            WorkerKvQueryResponse::TreeDumpFailed { .. } => "TreeDumpFailed",
            WorkerKvQueryResponse::Status(_) => "Status",
            // Non-exhaustive upstream: a future variant is "anything else" (nothing done).
            _ => "Other",
        }
    }

    /// [`Consumer::apply_recovery`] on a JSON body parsed with 1.6.1's types.
    pub fn apply_recovery_json(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        body: &str,
    ) -> Result<&'static str, Error> {
        let response = crate::wire::parse_v161(body)?;
        Ok(self.apply_recovery(worker_id, dp_rank, response))
    }

    /// 1.6.1's `find_matches(sequence, early_exit = false)`: per `(worker_id, dp_rank)` the
    /// number of leading blocks matched, sorted.
    pub fn find_matches(&self, tokens_hashes: &[u64]) -> Vec<(u64, u32, u32)> {
        let scores = self.tree.find_matches(
            tokens_hashes.iter().copied().map(LocalBlockHash).collect(),
            false,
        );
        let mut out: Vec<_> = scores
            .scores
            .iter()
            .map(|(w, &s)| (w.worker_id, w.dp_rank, s))
            .collect();
        out.sort_unstable();
        out
    }

    /// The canonical JSON of the tree (see the module doc). Equal trees ⇔ equal strings.
    pub fn state(&self) -> String {
        canonical_state(&self.tree.dump_tree_as_events())
    }
}

/// Canonical state of a tree given as its `dump_tree_as_events` (parents before children).
pub fn canonical_state(dump: &[RouterEvent]) -> String {
    // Edges are shared between workers, so a block hash's path is known once any worker's
    // event has carried it.
    let mut paths: HashMap<u64, Vec<PathStep>> = HashMap::new();
    type Blocks = BTreeSet<(Vec<PathStep>, u64)>;
    let mut per_worker: BTreeMap<(u64, u32), Blocks> = BTreeMap::new();
    for event in dump {
        let KvCacheEventData::Stored(store) = &event.event.data else {
            continue;
        };
        let worker = WorkerWithDpRank::new(event.worker_id, event.event.dp_rank);
        let mut path = match store.parent_hash {
            None => Vec::new(),
            Some(parent) => paths
                .get(&parent.0)
                .cloned()
                .unwrap_or_else(|| vec![PathStep::Dangling(format!("?{}", parent.0))]),
        };
        let blocks = per_worker
            .entry((worker.worker_id, worker.dp_rank))
            .or_default();
        for block in &store.blocks {
            path.push(PathStep::Hash(block.tokens_hash.0));
            paths
                .entry(block.block_hash.0)
                .or_insert_with(|| path.clone());
            blocks.insert((path.clone(), block.block_hash.0));
        }
    }
    let state = State {
        workers: per_worker
            .into_iter()
            .filter(|(_, blocks)| !blocks.is_empty())
            .map(|((worker_id, dp_rank), blocks)| WorkerState {
                worker_id,
                dp_rank,
                blocks: blocks.into_iter().collect(),
            })
            .collect(),
    };
    serde_json::to_string(&state).expect("state serializes")
}
