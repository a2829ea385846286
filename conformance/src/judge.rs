//! The ZMQ judge: Dynamo 1.6.1's **standalone indexer** (feature `standalone-indexer`) fed by
//! a real engine-side ZMQ publisher, as the `/register` handler of its HTTP server feeds it.
//!
//! [`StandaloneJudge`] owns one `services::indexer::registry::WorkerRegistry` on its own tokio
//! runtime. [`StandaloneJudge::register`] is what `POST /register` does after validating the
//! JSON (`registry.register(instance_id, endpoint, dp_rank, model, group, block_size,
//! replay_endpoint)`): it spawns 1.6.1's own ZMQ listener (a SUB socket on the endpoint, a
//! DEALER on the replay endpoint, 1.6.1's cursor for gap detection, `decode_event_batch` and
//! `ZmqEventNormalizer` for the vLLM wire, the filters of `zmq_wire::filter`, and the indexer
//! with its lower tiers). [`StandaloneJudge::pause`] / [`StandaloneJudge::resume`] are the
//! `/test/pause_listener` and `/test/resume_listener` handlers (`pause_listener` cancels the
//! listener; `resume_listener` starts a new one with the same watermark, so its first live
//! batch after a pause is a gap that it fills through the replay socket).
//!
//! The state ([`StandaloneJudge::state`]) is the indexer's `dump_events()` (what `GET /dump`
//! serves) split by storage tier, each tier in the crate's canonical form
//! ([`crate::consumer::canonical_state`]): `{"device": <state>, "host_pinned": <state>, ..}`
//! with only the tiers that hold an event. Equal strings: every later match and every later
//! event resolves alike (see the consumer module doc).
//!
//! 1.6.1 keeps the listener's watermark private (`WorkerRegistry::watermarks`), so the judge
//! cannot be asked for it; what the listener did is read from its own log lines instead: a
//! process-wide `tracing` layer records the INFO/WARN events of
//! `dynamo_kv_router::services::indexer` emitted on a judge's runtime threads (each judge
//! names its threads), e.g. `Gap detected: expected seq 3, got 9` (fields `expected`, `got`)
//! and `Replay complete` (field `replayed`). [`StandaloneJudge::log`] returns them in order.
//!
//! Errors: `register` fails with [`Error::BadArgument`] for what 1.6.1 refuses (the same
//! `(worker, dp_rank)` twice, another block size for the model); `pause`/`resume` with
//! [`Error::BadArgument`] for an unknown listener or a wrong state (1.6.1's
//! `ListenerControlError`); `state` with [`Error::Indexer`] when the dump fails.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dynamo_kv_router::protocols::{LocalBlockHash, RouterEvent, StorageTier};
use dynamo_kv_router::services::indexer::registry::WorkerRegistry;
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::Error;
use crate::consumer::canonical_state;

/// The model and routing group every judge registers its workers under (one indexer).
pub const MODEL: &str = "kvshm-conformance";
pub const ROUTING_GROUP: &str = "default";

/// Log lines kept per judge (the oldest beyond this are dropped).
const LOG_CAP: usize = 100_000;

/// One log line of the standalone indexer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLine {
    pub level: String,
    pub target: String,
    pub message: String,
    /// Every other field, formatted as tracing formats it (`u64` fields as decimal).
    pub fields: BTreeMap<String, String>,
}

type Sink = Arc<Mutex<Vec<LogLine>>>;

/// Judge id (in its runtime threads' names) -> its log.
fn sinks() -> &'static Mutex<BTreeMap<u64, Sink>> {
    static SINKS: OnceLock<Mutex<BTreeMap<u64, Sink>>> = OnceLock::new();
    SINKS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

const THREAD_PREFIX: &str = "kvshm-judge-";
const TARGET_PREFIX: &str = "dynamo_kv_router::services::indexer";

fn judge_of_thread() -> Option<u64> {
    let current = std::thread::current();
    current.name()?.strip_prefix(THREAD_PREFIX)?.parse().ok()
}

struct Capture;

#[derive(Default)]
struct Fields {
    message: String,
    rest: BTreeMap<String, String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.rest.insert(field.name().to_string(), text);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest
                .insert(field.name().to_string(), value.to_string());
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest
            .insert(field.name().to_string(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest
            .insert(field.name().to_string(), value.to_string());
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target().starts_with(TARGET_PREFIX) && *metadata.level() <= Level::INFO
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let Some(id) = judge_of_thread() else { return };
        let Some(sink) = sinks().lock().expect("sinks lock").get(&id).cloned() else {
            return;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut log = sink.lock().expect("log lock");
        if log.len() >= LOG_CAP {
            log.remove(0);
        }
        log.push(LogLine {
            level: meta.level().to_string(),
            target: meta.target().to_string(),
            message: fields.message,
            fields: fields.rest,
        });
    }
}

/// Installs the capturing layer as the process's global subscriber, once. If another global
/// subscriber was installed first, nothing is captured (and `log()` stays empty: callers that
/// assert on the log fail visibly).
fn install_capture() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Dynamo 1.6.1's standalone indexer (its `WorkerRegistry`) on a private runtime.
pub struct StandaloneJudge {
    id: u64,
    rt: tokio::runtime::Runtime,
    registry: Arc<WorkerRegistry>,
    sink: Sink,
}

impl StandaloneJudge {
    /// A registry with `threads` indexer threads (the server's `--threads`; 1 = its default
    /// single-threaded indexer), ready (the server signals ready before serving).
    pub fn new(threads: usize) -> Result<Self, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        install_capture();
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("{THREAD_PREFIX}{id}"))
            .enable_all()
            .build()
            .map_err(|e| Error::Runtime(format!("tokio runtime: {e}")))?;
        let sink: Sink = Arc::default();
        sinks().lock().expect("sinks lock").insert(id, sink.clone());
        let registry = {
            let _guard = rt.enter();
            Arc::new(WorkerRegistry::new(threads.max(1)))
        };
        registry.signal_ready();
        Ok(Self {
            id,
            rt,
            registry,
            sink,
        })
    }

    /// `POST /register {instance_id, endpoint, dp_rank, model_name, routing_group, block_size,
    /// replay_endpoint}`: spawns 1.6.1's ZMQ listener for `(worker_id, dp_rank)`.
    pub fn register(
        &self,
        worker_id: u64,
        dp_rank: u32,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        block_size: u32,
    ) -> Result<(), Error> {
        if block_size == 0 {
            return Err(Error::BadArgument("block_size must be > 0".into()));
        }
        self.rt
            .block_on(self.registry.register(
                worker_id,
                endpoint.to_string(),
                dp_rank,
                MODEL.to_string(),
                ROUTING_GROUP.to_string(),
                block_size,
                replay_endpoint.map(str::to_string),
            ))
            .map_err(|e| Error::BadArgument(format!("register: {e}")))
    }

    /// `POST /test/pause_listener`: the listener of `(worker_id, dp_rank)` is cancelled.
    pub fn pause(&self, worker_id: u64, dp_rank: u32) -> Result<(), Error> {
        let _guard = self.rt.enter();
        self.registry
            .pause_listener(worker_id, dp_rank)
            .map_err(|e| Error::BadArgument(format!("pause: {e}")))
    }

    /// `POST /test/resume_listener`: a new listener with the same watermark.
    pub fn resume(&self, worker_id: u64, dp_rank: u32) -> Result<(), Error> {
        self.rt
            .block_on(self.registry.resume_listener(worker_id, dp_rank))
            .map_err(|e| Error::BadArgument(format!("resume: {e}")))
    }

    /// `GET /workers`: 1.6.1's `WorkerInfo` list as JSON (listener status per rank).
    pub fn workers_json(&self) -> Result<String, Error> {
        serde_json::to_string(&self.registry.list())
            .map_err(|e| Error::Runtime(format!("serialize workers: {e}")))
    }

    fn dump(&self) -> Result<Vec<RouterEvent>, Error> {
        let Some(indexer) = self
            .registry
            .all_indexers_with_block_size()
            .into_iter()
            .map(|(_, indexer, _)| indexer)
            .next()
        else {
            return Ok(Vec::new());
        };
        self.rt
            .block_on(indexer.dump_events())
            .map_err(|e| Error::Indexer(format!("dump_events: {e}")))
    }

    /// `GET /dump`'s events (1.6.1's `RouterEvent` JSON list).
    pub fn dump_json(&self) -> Result<String, Error> {
        serde_json::to_string(&self.dump()?)
            .map_err(|e| Error::Runtime(format!("serialize dump: {e}")))
    }

    /// The canonical state per storage tier (module doc).
    pub fn state(&self) -> Result<String, Error> {
        let mut tiers: BTreeMap<String, Vec<RouterEvent>> = BTreeMap::new();
        for event in self.dump()? {
            tiers
                .entry(tier_name(event.storage_tier))
                .or_default()
                .push(event);
        }
        let mut out = String::from("{");
        for (i, (tier, events)) in tiers.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&serde_json::to_string(tier).expect("str serializes"));
            out.push(':');
            if tier == "device" {
                out.push_str(&canonical_state(events));
            } else {
                out.push_str(&canonical_state(&parents_first(events)));
            }
        }
        out.push('}');
        Ok(out)
    }

    /// The device tier's `find_matches` over `LocalBlockHash`es: `(worker, dp_rank, score)`, sorted.
    pub fn find_matches(&self, tokens_hashes: &[u64]) -> Result<Vec<(u64, u32, u32)>, Error> {
        let Some(indexer) = self
            .registry
            .all_indexers_with_block_size()
            .into_iter()
            .map(|(_, indexer, _)| indexer)
            .next()
        else {
            return Ok(Vec::new());
        };
        let hashes = tokens_hashes.iter().copied().map(LocalBlockHash).collect();
        let scores = self
            .rt
            .block_on(indexer.find_matches(hashes))
            .map_err(|e| Error::Indexer(format!("find_matches: {e}")))?;
        let mut out: Vec<_> = scores
            .scores
            .iter()
            .map(|(w, &s)| (w.worker_id, w.dp_rank, s))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// The indexer's log lines so far (module doc).
    pub fn log(&self) -> Vec<LogLine> {
        self.sink.lock().expect("log lock").clone()
    }
}

impl Drop for StandaloneJudge {
    fn drop(&mut self) {
        sinks().lock().expect("sinks lock").remove(&self.id);
    }
}

/// A lower tier's dump in an order [`canonical_state`] can read: every Stored event after the
/// event that stored its parent (1.6.1's lower-tier indexers dump in hash-map order; the
/// device tier's radix tree dumps parents first already and is read as it comes). Stable:
/// an event keeps its place among those ready at the same pass; a parent no event stores
/// stays dangling.
fn parents_first(events: &[RouterEvent]) -> Vec<RouterEvent> {
    use dynamo_kv_router::protocols::KvCacheEventData;
    use std::collections::HashSet;
    let stores = |e: &RouterEvent| match &e.event.data {
        KvCacheEventData::Stored(s) => s.blocks.iter().map(|b| b.block_hash.0).collect(),
        _ => Vec::new(),
    };
    let parent = |e: &RouterEvent| match &e.event.data {
        KvCacheEventData::Stored(s) => s.parent_hash.map(|h| h.0),
        _ => None,
    };
    let stored_somewhere: HashSet<u64> = events.iter().flat_map(stores).collect();
    let mut emitted: HashSet<u64> = HashSet::new();
    let mut pending: Vec<&RouterEvent> = events.iter().collect();
    let mut out = Vec::with_capacity(events.len());
    while !pending.is_empty() {
        let before = pending.len();
        let mut rest = Vec::new();
        for e in pending {
            let ready =
                parent(e).is_none_or(|p| emitted.contains(&p) || !stored_somewhere.contains(&p));
            if ready {
                emitted.extend(stores(e));
                out.push(e.clone());
            } else {
                rest.push(e);
            }
        }
        if rest.len() == before {
            // A cycle of parents (not a tree): keep the rest in dump order.
            out.extend(rest.into_iter().cloned());
            break;
        }
        pending = rest;
    }
    out
}

fn tier_name(tier: StorageTier) -> String {
    match serde_json::to_value(tier) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{tier:?}"),
    }
}
