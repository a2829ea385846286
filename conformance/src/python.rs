//! The PyO3 module `kvshm_conformance` (API in the crate doc and `kvshm_conformance.pyi`).

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::Error;
use crate::consumer::Consumer as RustConsumer;
use crate::judge::StandaloneJudge as RustJudge;
use crate::reference::Reference;
use crate::trace::{self, Op, StoredInput};

fn py_err(e: Error) -> PyErr {
    match e {
        Error::BadOp(_) | Error::Parse(_) | Error::BadArgument(_) => {
            PyValueError::new_err(e.to_string())
        }
        Error::Indexer(_) | Error::Runtime(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

/// An int in [-2**63, 2**64) as a u64 (negatives: two's complement, as the old extension's i64).
fn hash_of(ob: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(u) = ob.extract::<u64>() {
        return Ok(u);
    }
    Ok(ob.extract::<i64>()? as u64)
}

/// Items of an int sequence; str, bytes and dicts are refused (as pyo3's `Vec` extraction does for str).
fn items<T>(
    ob: &Bound<'_, PyAny>,
    what: &str,
    f: impl Fn(&Bound<'_, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    if ob.is_instance_of::<PyString>()
        || ob.is_instance_of::<PyBytes>()
        || ob.is_instance_of::<PyDict>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a sequence of ints, not {}",
            ob.get_type().name()?
        )));
    }
    ob.try_iter()?.map(|item| f(&item?)).collect()
}

/// Dynamo 1.6.1's `LocalKvIndexer` with the old `kv_local_indexer` extension's API.
#[pyclass(module = "kvshm_conformance")]
struct LocalIndexer {
    inner: Reference,
}

#[pymethods]
impl LocalIndexer {
    #[new]
    #[pyo3(signature = (worker_id, kv_block_size, max_buffer_size=10000))]
    fn new(worker_id: u64, kv_block_size: u32, max_buffer_size: usize) -> PyResult<Self> {
        Reference::new(worker_id, kv_block_size, max_buffer_size)
            .map(|inner| Self { inner })
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (seq, token_ids, block_hashes, parent_hash=None, dp_rank=0, lora_name=None, is_eagle=None))]
    fn apply_stored(
        &self,
        py: Python<'_>,
        seq: u64,
        token_ids: &Bound<'_, PyAny>,
        block_hashes: &Bound<'_, PyAny>,
        parent_hash: Option<&Bound<'_, PyAny>>,
        dp_rank: u32,
        lora_name: Option<String>,
        is_eagle: Option<bool>,
    ) -> PyResult<()> {
        let tokens = items(token_ids, "token_ids", |t| t.extract::<u32>())?;
        let hashes = items(block_hashes, "block_hashes", hash_of)?;
        let parent = parent_hash.map(hash_of).transpose()?;
        let inner = &self.inner;
        py.detach(|| {
            let event = trace::stored_event(
                inner.worker_id(),
                seq,
                dp_rank,
                &StoredInput {
                    block_size: inner.block_size(),
                    tokens: &tokens,
                    hashes: &hashes,
                    parent,
                    lora_name: lora_name.as_deref(),
                    is_eagle,
                },
            );
            inner.apply(event)
        })
        .map_err(|e| PyRuntimeError::new_err(format!("apply_stored failed: {e}")))
    }

    #[pyo3(signature = (seq, block_hashes, dp_rank=0))]
    fn apply_removed(
        &self,
        py: Python<'_>,
        seq: u64,
        block_hashes: &Bound<'_, PyAny>,
        dp_rank: u32,
    ) -> PyResult<()> {
        let hashes = items(block_hashes, "block_hashes", hash_of)?;
        let inner = &self.inner;
        py.detach(|| {
            inner.apply(trace::removed_event(
                inner.worker_id(),
                seq,
                dp_rank,
                &hashes,
            ))
        })
        .map_err(|e| PyRuntimeError::new_err(format!("apply_removed failed: {e}")))
    }

    #[pyo3(signature = (seq, dp_rank=0))]
    fn apply_cleared(&self, py: Python<'_>, seq: u64, dp_rank: u32) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.apply(trace::cleared_event(inner.worker_id(), seq, dp_rank)))
            .map_err(|e| PyRuntimeError::new_err(format!("apply_cleared failed: {e}")))
    }

    #[pyo3(signature = (start=None, end=None))]
    fn get_events_json(
        &self,
        py: Python<'_>,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<String> {
        let inner = &self.inner;
        py.detach(|| inner.query_json(start, end)).map_err(py_err)
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// deepinfra's global-indexer consumer on 1.6.1's RadixTree (not thread-safe: one thread).
#[pyclass(module = "kvshm_conformance", unsendable)]
struct Consumer {
    inner: RustConsumer,
    block_size: Option<u32>,
}

#[pymethods]
impl Consumer {
    #[new]
    #[pyo3(signature = (kv_block_size=None))]
    fn new(kv_block_size: Option<u32>) -> Self {
        Self {
            inner: RustConsumer::new(),
            block_size: kv_block_size,
        }
    }

    fn observe(&self, worker_id: u64, dp_rank: u32, seq: u64) -> &'static str {
        self.inner.observe(worker_id, dp_rank, seq).name()
    }

    #[pyo3(signature = (worker_id, dp_rank, op_json, kv_block_size=None))]
    fn apply_live(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        op_json: &str,
        kv_block_size: Option<u32>,
    ) -> PyResult<&'static str> {
        let op = Op::parse(op_json).map_err(py_err)?;
        let block_size = kv_block_size.or(self.block_size);
        let block_size = match (&op, block_size) {
            (_, Some(bs)) => bs,
            (Op::Stored { .. }, None) => {
                return Err(PyValueError::new_err(
                    "a stored op needs kv_block_size (argument or Consumer(kv_block_size=...))",
                ));
            }
            (_, None) => 0,
        };
        self.inner
            .apply_live(worker_id, dp_rank, block_size, &op)
            .map(|o| o.name())
            .map_err(py_err)
    }

    #[pyo3(signature = (worker_id, dp_rank, seq, ops_json, kv_block_size=None))]
    fn apply_live_batch(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        seq: u64,
        ops_json: Vec<String>,
        kv_block_size: Option<u32>,
    ) -> PyResult<&'static str> {
        let ops = ops_json
            .iter()
            .map(|j| Op::parse(j))
            .collect::<Result<Vec<_>, _>>()
            .map_err(py_err)?;
        let block_size = kv_block_size.or(self.block_size);
        let needs = ops.iter().any(|op| matches!(op, Op::Stored { .. }));
        let block_size = match block_size {
            Some(bs) => bs,
            None if needs => {
                return Err(PyValueError::new_err(
                    "a stored op needs kv_block_size (argument or Consumer(kv_block_size=...))",
                ));
            }
            None => 0,
        };
        self.inner
            .apply_live_batch(worker_id, dp_rank, block_size, seq, &ops)
            .map(|o| o.name())
            .map_err(py_err)
    }

    fn apply_recovery(
        &mut self,
        worker_id: u64,
        dp_rank: u32,
        response_json: &str,
    ) -> PyResult<&'static str> {
        self.inner
            .apply_recovery_json(worker_id, dp_rank, response_json)
            .map_err(py_err)
    }

    fn watermark(&self, worker_id: u64, dp_rank: u32) -> Option<u64> {
        self.inner.watermark(worker_id, dp_rank)
    }

    fn state(&self) -> String {
        self.inner.state()
    }

    fn find_matches(&self, tokens_hashes: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u32, u32)>> {
        let hashes = items(tokens_hashes, "tokens_hashes", hash_of)?;
        Ok(self.inner.find_matches(&hashes))
    }
}

/// Dynamo 1.6.1's standalone indexer (WorkerRegistry + its ZMQ listeners) on a private runtime.
#[pyclass(module = "kvshm_conformance")]
struct StandaloneJudge {
    inner: RustJudge,
}

#[pymethods]
impl StandaloneJudge {
    #[new]
    #[pyo3(signature = (threads=1))]
    fn new(threads: usize) -> PyResult<Self> {
        RustJudge::new(threads)
            .map(|inner| Self { inner })
            .map_err(py_err)
    }

    #[pyo3(signature = (worker_id, dp_rank, endpoint, replay_endpoint, block_size))]
    fn register(
        &self,
        py: Python<'_>,
        worker_id: u64,
        dp_rank: u32,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        block_size: u32,
    ) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.register(worker_id, dp_rank, endpoint, replay_endpoint, block_size))
            .map_err(py_err)
    }

    fn pause(&self, py: Python<'_>, worker_id: u64, dp_rank: u32) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.pause(worker_id, dp_rank))
            .map_err(py_err)
    }

    fn resume(&self, py: Python<'_>, worker_id: u64, dp_rank: u32) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| inner.resume(worker_id, dp_rank))
            .map_err(py_err)
    }

    fn workers_json(&self) -> PyResult<String> {
        self.inner.workers_json().map_err(py_err)
    }

    fn dump_json(&self, py: Python<'_>) -> PyResult<String> {
        let inner = &self.inner;
        py.detach(|| inner.dump_json()).map_err(py_err)
    }

    fn state(&self, py: Python<'_>) -> PyResult<String> {
        let inner = &self.inner;
        py.detach(|| inner.state()).map_err(py_err)
    }

    fn find_matches(
        &self,
        py: Python<'_>,
        tokens_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<(u64, u32, u32)>> {
        let hashes = items(tokens_hashes, "tokens_hashes", hash_of)?;
        let inner = &self.inner;
        py.detach(|| inner.find_matches(&hashes)).map_err(py_err)
    }

    /// The indexer's log lines: (level, message, fields) tuples, oldest first.
    fn log(&self) -> Vec<(String, String, std::collections::BTreeMap<String, String>)> {
        self.inner
            .log()
            .into_iter()
            .map(|l| (l.level, l.message, l.fields))
            .collect()
    }
}

/// Parse a `/kv_recover` body with 1.6.1's types ("1.6.1") or the older ones ("b2b7868").
#[pyfunction]
fn parse_response(json: &str, types: &str) -> PyResult<String> {
    crate::wire::parse_response(json, types).map_err(py_err)
}

#[pymodule]
fn kvshm_conformance(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LocalIndexer>()?;
    m.add_class::<Consumer>()?;
    m.add_class::<StandaloneJudge>()?;
    m.add_function(wrap_pyfunction!(parse_response, m)?)?;
    Ok(())
}
