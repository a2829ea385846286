//! The reference: Dynamo 1.6.1's real `LocalKvIndexer`, driven synchronously.
//!
//! A `Reference` owns a small multi-thread tokio runtime (the dump build of
//! `get_events_in_id_range` is spawned and awaited, so `block_on` needs worker threads)
//! and the indexer, whose inner `KvIndexer` runs the radix tree on its own OS thread.
//! Events go in through `apply_event_with_buffer` (recorded once the tree's queue admits
//! them; a dump drains that queue first, so a query always sees every applied event);
//! answers come from `get_events_in_id_range`, serialized with serde_json exactly as the
//! old extension's `get_events_json` did.

use std::sync::Arc;

use dynamo_kv_router::indexer::{KvIndexerMetrics, LocalKvIndexer, WorkerKvQueryResponse};
use dynamo_kv_router::protocols::RouterEvent;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::trace::Op;

/// One worker's `LocalKvIndexer` (one producer, one seq space).
pub struct Reference {
    // Field order matters on drop: the indexer goes before the runtime.
    inner: Arc<LocalKvIndexer>,
    token: CancellationToken,
    rt: Runtime,
    worker_id: u64,
    block_size: u32,
}

impl Reference {
    /// A fresh indexer. `block_size` must be > 0 (as the old extension required).
    pub fn new(worker_id: u64, block_size: u32, max_buffer_size: usize) -> Result<Self, Error> {
        if block_size == 0 {
            return Err(Error::BadArgument("kv_block_size must be > 0".into()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("kvshm-conformance-rt")
            .build()
            .map_err(|e| Error::Runtime(format!("build tokio runtime: {e}")))?;
        let token = CancellationToken::new();
        let inner = {
            let _guard = rt.enter();
            Arc::new(LocalKvIndexer::new(
                token.clone(),
                block_size,
                Arc::new(KvIndexerMetrics::new_unregistered()),
                max_buffer_size,
            ))
        };
        Ok(Self {
            inner,
            token,
            rt,
            worker_id,
            block_size,
        })
    }

    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// `apply_event_with_buffer`. Fails only when the indexer is shut down (`IndexerOffline`);
    /// a tree-level rejection (unknown parent, unknown block) is not reported, as in 1.6.1.
    pub fn apply(&self, event: RouterEvent) -> Result<(), Error> {
        self.rt
            .block_on(self.inner.apply_event_with_buffer(event))
            .map_err(|e| Error::Indexer(e.to_string()))
    }

    /// Apply a trace op (a query op is answered instead and returns its answer).
    pub fn apply_op(&self, op: &Op) -> Result<Option<WorkerKvQueryResponse>, Error> {
        match op {
            Op::Query { start, end, .. } => Ok(Some(self.query(*start, *end))),
            _ => {
                let event = op
                    .event(self.worker_id, self.block_size)
                    .expect("non-query op has an event");
                self.apply(event).map(|()| None)
            }
        }
    }

    /// `get_events_in_id_range(start, end)`.
    pub fn query(&self, start: Option<u64>, end: Option<u64>) -> WorkerKvQueryResponse {
        self.rt
            .block_on(self.inner.get_events_in_id_range(start, end))
    }

    /// `get_events_in_id_range(start, end)` as 1.6.1's serde_json output (the wire body).
    pub fn query_json(&self, start: Option<u64>, end: Option<u64>) -> Result<String, Error> {
        serde_json::to_string(&self.query(start, end))
            .map_err(|e| Error::Runtime(format!("serialize response: {e}")))
    }

    /// Stop the indexer's thread. Idempotent; later applies fail with `Error::Indexer`.
    pub fn shutdown(&self) {
        self.token.cancel();
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        self.token.cancel();
    }
}
