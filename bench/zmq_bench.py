"""The ZMQ publishing measurements: what an engine pays per KV-event batch, and how fast a subscriber sees it.

    PYTHONPATH=pybind/src KVSHMD_BIN=build/kvshmd .venv/bin/python bench/zmq_bench.py --out build/bench/zmq.json

(`make bench` runs it as recovery_bench.py's section "zmq".) Three sides, measured in the same run on the same
seeded vLLM-shaped batches (_vllm.py: a headline workload of one 32-block x 32-token BlockStored per batch, and a
mix of 1-4 Stored/Removed events per batch with an occasional AllBlocksCleared):

* (a) today: the engine builds ``KVEventBatch(ts, events)``; a vLLM-style publisher encodes it with msgspec and
  sends ``[topic, seq u64 BE, payload]`` on a pyzmq PUB (keeping the payload for replay), and the engine applies
  each event to the reference in-process LocalKvIndexer (kvshm_conformance: Dynamo 1.6.1, the old extension's API).
* (b) the same with kvshm's ``LocalIndexer.apply_stored/removed/cleared`` as the in-process indexer.
* (c) kvshm publishing: ``LocalIndexer(..., publish=kvshm.ZmqPublish(...)).apply_batch(seq, events, ts)``; kvshmd
  encodes and sends.

The indexers of (a) and (b) get one id per event (the old single-event API), the ZMQ seq counts batches (vLLM's rule);
(c) gives the batch's seq, and kvshmd numbers the wire (docs/lifecycle.md: its own counter; it also publishes the
incarnation's start Cleared and, on an idle stream, an empty heartbeat batch every second, which the subscriber
skips: they are no engine batch, and their ts is kvshmd's, not the engine's).

Measurements:

* inline: every call of each side timed with all of its work in the timing thread (batch object, encode, send,
  indexer apply), sides rotated every round; (a) and (b) also timed in two parts (encode+send, indexer apply).
* threaded: each side in its own engine process (``zmq_bench.py engine``), shaped as vLLM runs it: the scheduler
  thread builds the batch and calls ``publish``; for (a)/(b) that puts it on a queue and a publisher thread encodes,
  sends and applies the indexer (a fork calling the indexer on the scheduler thread moves the inline "indexer
  apply" column there); for (c) ``publish`` is ``apply_batch`` on the scheduler thread. Paced at ``--rate`` batches/s;
  the engine process's CPU (all threads, libzmq's I/O thread included) and the scheduler and publisher threads'
  CPU (pthread CPU clocks) per batch, minus an idle engine running the same pacing loop; kvshmd's CPU for (b)/(c)
  (its threads' schedstat, ns). Again for (a) and (c) at ``--zmq-node-rates`` (default 100 batches/s), the
  headline workload only: the node figure, engine + kvshmd against (a), at both rates.
* latency: during the threaded runs a pyzmq SUB in another process (``zmq_bench.py sub``) stamps each message's
  arrival with time.time() and subtracts the batch's ts from its payload (the engine's time.time() when it built the
  batch: the same clock across processes).

Without kvshm_conformance, (a) is skipped; without ``kvshm.ZmqPublish``/``apply_batch`` (a kvshm before ZMQ publishing),
(c) is skipped; the report says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "pybind" / "src"))
sys.path.insert(0, str(HERE.parent / "testkit"))
from _common import JsonChild, commands, cpu_self, proc_cpu_s, reply, summary  # noqa: E402
from _vllm import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KVEventBatch,
    Workload,
)

import kvshm  # noqa: E402
from kvshm_testkit import free_port  # noqa: E402

SIDES = ("a", "b", "c")
WORKLOADS = ("headline", "mix")
DP_RANK = 0  # vLLM's publisher stamps its rank on a batch that has none


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] zmq: {msg}", file=sys.stderr, flush=True)


def reference() -> tuple[Any, str]:
    try:
        import kvshm_conformance
    except ImportError as e:
        return None, f"kvshm_conformance not importable: {e}"
    return kvshm_conformance.LocalIndexer, ""


def kvshm_publishes() -> str:
    """Empty when this kvshm has the ZMQ publishing API, else why not."""
    missing = [n for n in ("ZmqPublish",) if not hasattr(kvshm, n)]
    if not hasattr(kvshm.LocalIndexer, "apply_batch"):
        missing.append("LocalIndexer.apply_batch")
    return f"this kvshm has no {', '.join(missing)} (the ZMQ publishing API)" if missing else ""


# --- the sides ------------------------------------------------------------------------------------------------------
class ZmqPublisher:
    """A vLLM-style KV-event publisher (written for this benchmark after vLLM 0.33.0's ZmqEventPublisher semantics):
    a PUB socket with the given HWM, a msgspec encoder, a seq counter from 0, the last ``buffer_steps`` payloads kept
    for replay. ``send`` encodes and sends on the calling thread; ``start_thread`` adds the queue and the publisher
    thread vLLM runs (``publish`` then only enqueues), with ``after_send`` called per batch on that thread."""

    def __init__(self, endpoint: str, topic: str, hwm: int = 100_000, buffer_steps: int = 10_000) -> None:
        import zmq

        self.ctx: Any = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.set_hwm(hwm)
        self.sock.linger = 0
        self.sock.bind(endpoint)
        self.topic = topic.encode()
        self.enc = msgspec.msgpack.Encoder()
        self.seqs = count()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.q: queue.Queue[KVEventBatch | None] | None = None
        self.thread: threading.Thread | None = None
        self.bytes_sent = 0

    def send(self, batch: KVEventBatch) -> int:
        seq = next(self.seqs)
        payload = self.enc.encode(batch)
        self.sock.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        self.bytes_sent += len(payload)
        return seq

    def start_thread(self, after_send: Callable[[KVEventBatch], None]) -> None:
        q: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=100_000)
        self.q = q

        def run() -> None:
            while True:
                batch = q.get()
                if batch is None:
                    q.task_done()
                    return
                self.send(batch)
                after_send(batch)
                q.task_done()

        self.thread = threading.Thread(target=run, name="zmq-publisher", daemon=True)
        self.thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        assert self.q is not None
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = DP_RANK
        self.q.put(batch)

    def close(self) -> None:
        if self.q is not None and self.thread is not None:
            self.q.put(None)
            self.thread.join(timeout=10)
        self.sock.close(linger=0)


class EventIndexer:
    """Feeds vLLM events to an indexer with the old single-event API (the reference extension or kvshm's
    LocalIndexer), one id per event."""

    def __init__(self, ix: Any) -> None:
        self.ix = ix
        self.ids = count(1)

    def apply(self, batch: KVEventBatch) -> None:
        ix, ids = self.ix, self.ids
        dp = batch.data_parallel_rank or 0
        for ev in batch.events:
            if ev.__class__ is BlockStored:
                ix.apply_stored(next(ids), ev.token_ids, ev.block_hashes, ev.parent_block_hash, dp, ev.lora_name)
            elif ev.__class__ is BlockRemoved:
                ix.apply_removed(next(ids), ev.block_hashes, dp)
            elif ev.__class__ is AllBlocksCleared:
                ix.apply_cleared(next(ids), dp)
            else:
                raise TypeError(f"not a vLLM KV event: {ev!r}")


class Side:
    """One side of the comparison in one process. ``inline(events)`` does all of a batch's work on the calling thread
    and returns the ns spent in its first part (encode+send for a/b, the whole call for c); ``publish(batch)`` is the
    scheduler thread's call once ``threaded()`` started the publisher thread (a/b)."""

    def __init__(self, kind: str, endpoint: str, topic: str, worker_id: int) -> None:
        self.kind = kind
        self.pub: ZmqPublisher | None = None
        self.indexer: EventIndexer | None = None
        self.kv: Any = None
        self.seqs = count()
        self.daemon_pid: int | None = None
        if kind in ("a", "b"):
            if kind == "a":
                ref, why = reference()
                if ref is None:
                    raise RuntimeError(why)
                self.indexer = EventIndexer(ref(worker_id, 32))
            else:
                self.kv = kvshm.LocalIndexer(worker_id, 32, ring_bytes=64 << 20)
                self.indexer = EventIndexer(self.kv)
            self.pub = ZmqPublisher(endpoint, topic)
        elif kind == "c":
            zp = kvshm.ZmqPublish(endpoint=endpoint, topic=topic)
            self.kv = kvshm.LocalIndexer(worker_id, 32, ring_bytes=64 << 20, publish=zp)
        elif kind != "idle":
            raise ValueError(kind)
        if self.kv is not None:
            core = self.kv._core  # noqa: SLF001 - the bench reads the private daemon's pid for its CPU
            self.daemon_pid = core.daemon.pid if core.daemon is not None else None

    def inline(self, events: list[Event]) -> int:
        batch = KVEventBatch(ts=time.time(), events=events)
        if self.kind == "c":
            self.kv.apply_batch(next(self.seqs), batch.events, batch.ts, DP_RANK)
            return 0
        assert self.pub is not None and self.indexer is not None
        batch.data_parallel_rank = DP_RANK
        t0 = time.perf_counter_ns()
        self.pub.send(batch)
        t1 = time.perf_counter_ns()
        self.indexer.apply(batch)
        return t1 - t0

    def threaded(self) -> None:
        if self.pub is not None:
            assert self.indexer is not None
            self.pub.start_thread(self.indexer.apply)

    def publish(self, batch: KVEventBatch) -> None:
        """The scheduler thread's call per batch."""
        if self.kind == "c":
            self.kv.apply_batch(next(self.seqs), batch.events, batch.ts, DP_RANK)
        elif self.pub is not None:
            self.pub.publish(batch)

    def drain(self) -> None:
        """Waits until the publisher thread has handled every queued batch."""
        if self.pub is not None and self.pub.q is not None:
            self.pub.q.join()

    def publisher_thread_ident(self) -> int | None:
        return self.pub.thread.ident if self.pub is not None and self.pub.thread is not None else None

    def dropped(self) -> int:
        if self.kv is None:
            return 0
        st = self.kv.stats()
        zd = (st.get("zmq") or {}).get("dropped", 0)  # by reason, or a total
        return int(st.get("dropped_events") or 0) + int(sum(zd.values()) if isinstance(zd, dict) else zd or 0)

    def close(self) -> None:
        if self.pub is not None:
            self.pub.close()
        if self.kv is not None:
            self.kv.shutdown()
        if self.indexer is not None and self.kind == "a":
            self.indexer.ix.shutdown()


# --- child processes --------------------------------------------------------------------------------------------
def thread_cpu(ident: int | None) -> float:
    if ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def proc_cpu(pid: int | None) -> float:
    """kvshmd's CPU seconds (every thread, from /proc: _common.proc_cpu_s); 0 without a daemon."""
    if pid is None:
        return 0.0
    try:
        return proc_cpu_s(pid)
    except OSError:
        return float("nan")


def engine(args: argparse.Namespace) -> None:
    """An engine process for one side: {"op": "run", "workload", "n", "rate"} publishes the workload's next n
    batches paced at rate batches/s from the main (scheduler) thread; replies with CPU and call times."""
    side = Side(args.side, args.endpoint, args.topic, args.worker_id)
    side.threaded()
    loads = {w: Workload(w) for w in WORKLOADS}
    loads["warm"] = Workload("mix", seed=99)  # the subscriber's warm-up, apart from the measured batches
    main_ident = threading.get_ident()
    reply({"ready": True, "daemon_pid": side.daemon_pid})
    for cmd in commands():
        if cmd["op"] == "quit":
            break
        batches = loads[cmd["workload"]].take(int(cmd["n"]))
        period = 1.0 / float(cmd["rate"])
        calls: list[int] = []
        gc.collect()
        pub_ident = side.publisher_thread_ident()
        c_proc, c_main, c_pub, c_daemon = cpu_self(), thread_cpu(main_ident), thread_cpu(pub_ident), \
            proc_cpu(side.daemon_pid)
        t_start = time.perf_counter()
        deadline = t_start
        for events in batches:
            deadline += period
            t0 = time.perf_counter_ns()
            side.publish(KVEventBatch(ts=time.time(), events=events))
            calls.append(time.perf_counter_ns() - t0)
            wait = deadline - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        side.drain()
        wall = time.perf_counter() - t_start
        reply({"batches": len(batches), "wall_s": wall, "proc_cpu_s": cpu_self() - c_proc,
               "main_cpu_s": thread_cpu(main_ident) - c_main, "pub_cpu_s": thread_cpu(pub_ident) - c_pub,
               "daemon_cpu_s": proc_cpu(side.daemon_pid) - c_daemon, "calls_ns": calls, "dropped": side.dropped()})
    side.close()


def ts_of(payload: bytes) -> float:
    """The batch ts of a vLLM KVEventBatch payload: msgpack [ts f64, ...] (a fixarray, then 0xcb and 8 bytes BE)."""
    if len(payload) >= 10 and payload[1] == 0xCB:
        return float(struct.unpack_from(">d", payload, 2)[0])
    return float(msgspec.msgpack.decode(payload)[0])


def is_heartbeat(payload: bytes) -> bool:
    """kvshmd's heartbeat on an idle publishing stream: a batch with no events (docs/lifecycle.md); an engine's batch
    always has one, so only a short payload is decoded."""
    if len(payload) > 32:
        return False
    doc = msgspec.msgpack.decode(payload)
    return isinstance(doc, list) and len(doc) == 3 and doc[1] == []


def sub(args: argparse.Namespace) -> None:
    """A subscriber process: connects a SUB to every endpoint; {"op": "take"} replies with what arrived since the last
    take, per topic: the seqs received and the latency samples (arrival time.time() - the batch's ts, in ns)."""
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.set_hwm(0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    for ep in args.connect.split(","):
        s.connect(ep)
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    got: dict[str, dict[str, list[int]]] = {}  # per topic: seqs, lat_ns, bytes (one total)
    reply({"ready": True})
    stdin = os.fdopen(sys.stdin.fileno(), "r", buffering=1)
    while True:
        ready = dict(poller.poll(1000))
        if s in ready:
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                now = time.time()
                topic, seq, payload = frames[0].decode(), int.from_bytes(frames[1], "big"), frames[2]
                if is_heartbeat(payload):
                    continue
                g = got.setdefault(topic, {"seqs": [], "lat_ns": [], "bytes": [0]})
                g["seqs"].append(seq)
                g["bytes"][0] += len(payload)
                g["lat_ns"].append(int((now - ts_of(payload)) * 1e9))
        if sys.stdin.fileno() in ready:
            line = stdin.readline()
            if not line or json.loads(line)["op"] == "quit":
                break
            reply({"got": got})
            got = {}
    s.close(linger=0)
    ctx.term()


class Child(JsonChild):
    """This script run as a subcommand (``engine``, ``sub``) in another process."""

    def __init__(self, *args: str) -> None:
        super().__init__([sys.executable, str(Path(__file__).resolve()), *args])


# --- the driver -----------------------------------------------------------------------------------------------------
def available() -> tuple[list[str], list[str]]:
    """The sides this run can measure, and why the others are skipped."""
    sides, skipped = [], []
    ref, why = reference()
    if ref is None:
        skipped.append(f"ZMQ side (a), the engine's own publisher + the reference indexer: {why}")
    else:
        sides.append("a")
    sides.append("b")
    why = kvshm_publishes()
    if why:
        skipped.append(f"ZMQ side (c), kvshmd publishing: {why}")
    else:
        sides.append("c")
    return sides, skipped


def wait_subscribed(sub_child: Child, fire: Callable[[str], object], sides: list[str],
                    seconds: float = 10.0) -> set[str]:
    """ZMQ's slow joiner: publishes on each side until the subscriber has seen it; returns the sides never seen."""
    pending = set(sides)
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        for side in pending:
            fire(side)
        time.sleep(0.05)
        pending -= set(sub_child.call({"op": "take"})["got"])
    return pending


def unheard(side: str, seconds: float = 10.0) -> str:
    return (f"ZMQ side ({side}): the subscriber received nothing from its endpoint within {seconds:.0f} s"
            + (" (kvshmd does not publish: is the daemon's publisher, stream pub, in this build?)" if side == "c"
               else ""))


def inline(cfg: argparse.Namespace, sides: list[str], skipped: list[str]) -> dict[str, Any]:
    """The inline phase; drops from ``sides`` (into ``skipped``, with why) a side that cannot start or publish."""
    log(f"inline: sides {sides}, {cfg.zmq_rounds} rounds x {cfg.zmq_n} batches per workload")
    ports = {s: free_port() for s in sides}
    objs: dict[str, Side] = {}
    for i, s in enumerate(list(sides)):
        try:
            objs[s] = Side(s, f"tcp://*:{ports[s]}", s, 30 + i)
        except Exception as e:  # reported as skipped, with its reason
            sides.remove(s)
            skipped.append(f"ZMQ side ({s}) could not start: {type(e).__name__}: {e}")
    subc = Child("sub", "--connect", ",".join(f"tcp://127.0.0.1:{ports[s]}" for s in sides))
    samples: dict[str, list[int]] = {}
    nbytes: dict[str, list[int]] = {}
    try:
        warm = Workload("mix", seed=99)
        for s in wait_subscribed(subc, lambda s: objs[s].inline(warm.take(1)[0]), sides):
            sides.remove(s)
            objs.pop(s).close()
            skipped.append(unheard(s))
        for w in WORKLOADS:
            load = Workload(w)
            for rnd in range(cfg.zmq_rounds):
                order = sides[rnd % len(sides):] + sides[: rnd % len(sides)]
                chunk = load.take(cfg.zmq_n)  # every side gets these same batches, in order
                enc = msgspec.msgpack.Encoder()
                nbytes.setdefault(w, []).extend(
                    len(enc.encode(KVEventBatch(ts=0.0, events=e, data_parallel_rank=0))) for e in chunk[:50])
                for s in order:
                    o = objs[s]
                    tot, part = samples.setdefault(f"{w}/{s}", []), samples.setdefault(f"{w}/{s}/send", [])
                    rest = samples.setdefault(f"{w}/{s}/apply", [])
                    gc.collect()
                    for events in chunk:
                        t0 = time.perf_counter_ns()
                        p = o.inline(events)
                        dt = time.perf_counter_ns() - t0
                        tot.append(dt)
                        if s != "c":
                            part.append(p)
                            rest.append(dt - p)
                subc.call({"op": "take"})  # keeps the subscriber's buffer small; inline latency is not reported
        dropped = {s: objs[s].dropped() for s in sides}
    finally:
        for o in objs.values():
            o.close()
        subc.close()
    return {"summary": {k: summary(v) for k, v in samples.items() if v}, "dropped": dropped,
            "payload_bytes": {w: sorted(v)[len(v) // 2] for w, v in nbytes.items()}}


def threaded(cfg: argparse.Namespace, sides: list[str], rate: float, seconds: float,
             workloads: tuple[str, ...] = WORKLOADS) -> dict[str, Any]:
    """Each side (and the idle engine) in its own engine process, ``rate`` batches/s for ``seconds`` per round and
    workload, sides rotated; per side and workload the CPU figures (engine process, its threads, kvshmd) per
    batch."""
    n = int(rate * seconds)
    log(f"threaded: sides {sides} + idle, {cfg.zmq_threaded_rounds} rounds x {n} batches at {rate:.0f}/s")
    ports = {s: free_port() for s in sides}
    kids: dict[str, Child] = {}
    subc: Child | None = None
    res: dict[str, dict[str, Any]] = {}
    try:
        for i, s in enumerate([*sides, "idle"]):
            ep = f"tcp://*:{ports[s]}" if s != "idle" else "tcp://*:0"
            kids[s] = Child("engine", "--side", s, "--endpoint", ep, "--topic", s, "--worker-id", str(40 + i))
        subc = Child("sub", "--connect", ",".join(f"tcp://127.0.0.1:{ports[s]}" for s in sides))
        never = wait_subscribed(subc, lambda s: kids[s].call({"op": "run", "workload": "warm", "n": 1, "rate": 1000}),
                                sides)
        if never:
            raise RuntimeError(f"the subscriber never received from {sorted(never)} in the threaded phase")
        subc.call({"op": "take"})
        for w in workloads:
            for rnd in range(cfg.zmq_threaded_rounds):
                names = [*sides, "idle"]
                order = names[rnd % len(names):] + names[: rnd % len(names)]
                for s in order:
                    out = kids[s].call({"op": "run", "workload": w, "n": n, "rate": rate})
                    time.sleep(0.05)  # the last batches reach the subscriber
                    got = subc.call({"op": "take"})["got"].get(s, {"seqs": [], "lat_ns": [], "bytes": [0]})
                    r = res.setdefault(f"{w}/{s}", {"runs": [], "calls": [], "lat": [], "received": 0, "bytes": 0})
                    r["bytes"] += got["bytes"][0]
                    r["runs"].append({k: v for k, v in out.items() if k != "calls_ns"})
                    r["calls"].extend(out["calls_ns"])
                    r["lat"].extend(got["lat_ns"])
                    r["received"] += len(got["seqs"])
    finally:
        for k in kids.values():
            k.close()
        if subc is not None:
            subc.close()
    outp: dict[str, Any] = {}
    for w in workloads:
        idle = res[f"{w}/idle"]["runs"]
        idle_batches = sum(x["batches"] for x in idle)
        base_proc = sum(x["proc_cpu_s"] for x in idle) / idle_batches
        base_main = sum(x["main_cpu_s"] for x in idle) / idle_batches
        for s in [*sides, "idle"]:
            r = res[f"{w}/{s}"]
            runs = r["runs"]
            nb = sum(x["batches"] for x in runs)
            wall = sum(x["wall_s"] for x in runs)
            proc = sum(x["proc_cpu_s"] for x in runs) / nb
            main = sum(x["main_cpu_s"] for x in runs) / nb
            pub = sum(x["pub_cpu_s"] for x in runs) / nb
            outp[f"{w}/{s}"] = {
                "batches": nb, "rate": nb / wall, "received": r["received"],
                "payload_bytes_mean": r["bytes"] / r["received"] if r["received"] else None,
                "engine_cpu_us": 1e6 * (proc - base_proc), "engine_cpu_pct": 100 * (proc - base_proc) * nb / wall,
                "raw_engine_cpu_us": 1e6 * proc,
                "scheduler_cpu_us": 1e6 * (main - base_main), "publisher_cpu_us": 1e6 * pub,
                "other_cpu_us": 1e6 * ((proc - base_proc) - (main - base_main) - pub),
                "daemon_cpu_us": 1e6 * sum(x["daemon_cpu_s"] for x in runs) / nb if s in ("b", "c") else None,
                "dropped": max((x["dropped"] for x in runs), default=0),
                "publish_call": summary(r["calls"]), "latency": summary(r["lat"]),
            }
    return outp


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    sides, skipped = available()
    t0 = time.perf_counter()
    out: dict[str, Any] = {"sides": sides, "skipped": skipped, "rounds": cfg.zmq_rounds, "n": cfg.zmq_n,
                           "rate": cfg.zmq_rate, "seconds": cfg.zmq_seconds,
                           "threaded_rounds": cfg.zmq_threaded_rounds}
    out["inline"] = inline(cfg, sides, skipped)
    out["inline_s"] = time.perf_counter() - t0
    out["threaded"] = threaded(cfg, sides, cfg.zmq_rate, cfg.zmq_seconds)
    # The node figure at the other rates: (a) and (c) only, the headline workload (the rate above is
    # measured already); the same engine processes' figures, kvshmd's CPU included.
    node_sides = [s for s in sides if s in ("a", "c")]
    out["node"] = {}
    for r in (float(x) for x in cfg.zmq_node_rates.split(",") if x):
        if r != cfg.zmq_rate and node_sides:
            out["node"][f"{r:g}"] = threaded(cfg, node_sides, r, cfg.zmq_node_seconds, ("headline",))
    out["node_seconds"] = cfg.zmq_node_seconds
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def add_args(p: argparse.ArgumentParser) -> None:
    def env(name: str, default: str) -> str:
        return os.environ.get(name) or default

    p.add_argument("--zmq-rounds", type=int, default=int(env("ZMQ_ROUNDS", "10")))
    p.add_argument("--zmq-n", type=int, default=int(env("ZMQ_N", "200")))
    p.add_argument("--zmq-rate", type=float, default=float(env("ZMQ_RATE", "1000")))
    p.add_argument("--zmq-seconds", type=float, default=float(env("ZMQ_SECONDS", "2")))
    p.add_argument("--zmq-threaded-rounds", type=int, default=int(env("ZMQ_THREADED_ROUNDS", "3")))
    p.add_argument("--zmq-node-rates", default=env("ZMQ_NODE_RATES", "100"),
                   help="other rates (batches/s) at which (a) and (c) are measured for the node figure")
    p.add_argument("--zmq-node-seconds", type=float, default=float(env("ZMQ_NODE_SECONDS", "3")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = p.add_subparsers(dest="cmd")
    e = sp.add_parser("engine")
    e.add_argument("--side", required=True, choices=[*SIDES, "idle"])
    e.add_argument("--endpoint", required=True)
    e.add_argument("--topic", required=True)
    e.add_argument("--worker-id", type=int, default=40)
    s = sp.add_parser("sub")
    s.add_argument("--connect", required=True)
    r = sp.add_parser("run")
    r.add_argument("--out", default=str(HERE.parent / "build" / "bench" / "zmq.json"))
    add_args(r)
    args = p.parse_args()
    if args.cmd == "engine":
        engine(args)
    elif args.cmd == "sub":
        sub(args)
    else:
        if args.cmd is None:
            args = r.parse_args([])
        out = run(args)
        for line in out["skipped"]:
            log(f"SKIPPED: {line}")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out))
        log(f"wrote {args.out} in {out['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
