"""The recovery measurements: kvshm against Dynamo 1.6.1's real LocalKvIndexer (the kvshm_conformance PyO3 module),
interleaved in one run; writes every sample's summary to a JSON file that results_report.py turns into RESULTS.md.

    PYTHONPATH=pybind/src KVSHMD_BIN=build/kvshmd \
        .venv/bin/python bench/recovery_bench.py --out build/bench/results.json

Sections (each can be skipped with --only):

* publish: apply_stored for 1..128 blocks x 32 tokens (lists), apply_removed, apply_cleared: kvshm.LocalIndexer
  (its private kvshmd draining meanwhile) vs the reference vs the floor (array conversion + one copy into a
  mapping), every call timed, sides rotated every round.
* queries: get_events_json on 100k resident blocks: 10 recent events, TooNew, InvalidRange, TreeDump fresh (an id
  gap invalidates both sides' dump cache first) and cached; byte sizes and whether the replies are identical.
* deployment: a shared `kvshmd serve --http` fed by an engine process (kvshm.LocalIndexer) vs an engine process
  that holds the reference and serves /kv_recover itself through ThreadingHTTPServer; a consumer's GET latency
  (Events, TreeDump), and each engine's apply_stored cost and CPU with and without recovery traffic.
* scale: TreeDump latency, memory per resident block (daemon RSS vs the reference's process RSS) and kvshmd's
  ingest rate (daemon stopped, a burst published, time to apply it) at growing resident blocks.
* workers: one shared kvshmd with 1/8/64 attached workers publishing at a paced rate: per-worker ingest, daemon
  CPU and RSS, Events latency over HTTP while all publish.
* zmq (zmq_bench.py): the engine's cost per KV-event batch with its own msgspec + pyzmq publisher and
  the reference or kvshm as the indexer, against kvshmd publishing (apply_batch); publish-to-subscriber latency.

Without the reference module (kvshm_conformance not importable) the comparisons are skipped and listed as such.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "pybind" / "src"))
sys.path.insert(0, str(ROOT / "testkit"))
import zmq_bench  # noqa: E402
from _common import (  # noqa: E402
    BS,
    ChainGen,
    JsonChild,
    busy_pct,
    last_event_id,
    machine_ticks,
    proc_cpu_s,
    same_reply,
    summary,
    variant,
)

from kvshm import LocalIndexer  # noqa: E402
from kvshm_testkit import Kvshmd, free_port, http_get, rss_bytes  # noqa: E402

try:
    import kvshm_conformance

    REF: Any = kvshm_conformance.LocalIndexer
    REF_ERROR = ""
except ImportError as e:  # the report says which comparisons were skipped
    REF = None
    REF_ERROR = str(e)

CHILD = [sys.executable, str(HERE / "_child.py")]
SKIPPED: list[str] = []


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "absent"


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "go": run([os.environ.get("GO", "go"), "version"]),
        "rustc": run(["rustc", "--version"]),
        "mem_gib": round(mem_kb / 2**20, 1),
        "loadavg_start": os.getloadavg(),
        "commit": run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "reference": "kvshm_conformance (dynamo-kv-router =1.6.1, LocalKvIndexer)" if REF else f"absent ({REF_ERROR})",
    }


class Child(JsonChild):
    """A _child.py process (its subcommand and flags in ``args``)."""

    def __init__(self, *args: str) -> None:
        super().__init__([*CHILD, *args])


def shared_daemon(binary: str) -> Kvshmd:
    """A shared `kvshmd serve` with --http in a fresh 0700 directory, for the deployment, scale and workers
    sections; healthy within 10 s."""
    return Kvshmd(binary, Path(tempfile.mkdtemp(prefix="kvshm-bench-"))).start(10.0)


def timed_ns(fn: Callable[[], object]) -> int:
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


# --- publish ----------------------------------------------------------------------------------------------------
def publish(cfg: argparse.Namespace) -> dict[str, Any]:
    log("publish: apply_stored/removed/cleared, kvshm vs reference vs floor")
    sizes = [int(s) for s in cfg.publish_sizes.split(",")]
    rng = random.Random(1)
    events = {}
    for b in sizes:
        tokens = [rng.randrange(0, 150_000) for _ in range(b * BS)]
        hashes = [rng.randrange(1, 1 << 63) for _ in range(b)]
        events[b] = (tokens, hashes)
    root = 12345
    kv = LocalIndexer(11, BS, ring_bytes=64 << 20)
    sides: dict[str, Any] = {"kvshm": kv}
    if REF:
        sides["ref"] = REF(11, BS)
    seqs = dict.fromkeys(sides, 1)
    for ix in sides.values():
        ix.apply_stored(1, list(range(BS)), [root], None)
    for k in seqs:
        seqs[k] = 2
    samples: dict[str, list[int]] = {}

    def add(key: str, ns: int) -> None:
        samples.setdefault(key, []).append(ns)

    mm = mmap.mmap(-1, 1 << 22)
    pos = [0]

    def floor(tokens: list[int], hashes: list[int]) -> None:
        t = array("I", tokens)
        h = array("Q", hashes)
        p = pos[0]
        end = p + 8 * len(h)
        mm[p:end] = h
        mm[end : end + 4 * len(t)] = t
        pos[0] = (end + 4 * len(t) + 64) % ((1 << 22) - (1 << 20))

    names = list(sides) + ["floor"]
    n = cfg.publish_n
    for rnd in range(cfg.publish_rounds):
        order = names[rnd % len(names):] + names[: rnd % len(names)]
        for b in sizes:
            tokens, hashes = events[b]
            for name in order:
                if name == "floor":
                    for _ in range(n):
                        add(f"stored/{b}/floor", timed_ns(lambda t=tokens, h=hashes: floor(t, h)))
                        add(f"removed/{b}/floor", timed_ns(lambda h=hashes: array("Q", h).tobytes()))
                    continue
                ix = sides[name]
                s = seqs[name]
                for _ in range(n):
                    t0 = time.perf_counter_ns()
                    ix.apply_stored(s, tokens, hashes, root)
                    t1 = time.perf_counter_ns()
                    ix.apply_removed(s + 1, hashes)
                    t2 = time.perf_counter_ns()
                    add(f"stored/{b}/{name}", t1 - t0)
                    add(f"removed/{b}/{name}", t2 - t1)
                    s += 2
                seqs[name] = s
        for name in order:
            if name == "floor":
                continue
            ix = sides[name]
            s = seqs[name]
            for _ in range(n // 4):
                t0 = time.perf_counter_ns()
                ix.apply_cleared(s)
                add(f"cleared/{name}", time.perf_counter_ns() - t0)
                ix.apply_stored(s + 1, list(range(BS)), [root], None)
                s += 2
            seqs[name] = s
    st = kv.stats()
    kv.shutdown()
    for name, ix in sides.items():
        if name != "kvshm":
            ix.shutdown()
    mm.close()
    return {"sizes": sizes, "n": n, "rounds": cfg.publish_rounds, "dropped_events": st["dropped_events"],
            "summary": {k: summary(v) for k, v in samples.items()}}


# --- queries ----------------------------------------------------------------------------------------------------
def queries(cfg: argparse.Namespace) -> dict[str, Any]:
    log(f"queries: get_events_json on {cfg.query_blocks} resident blocks")
    kv = LocalIndexer(12, BS, ring_bytes=64 << 20)
    sides: dict[str, Any] = {"kvshm": kv}
    if REF:
        sides["ref"] = REF(12, BS)
    gen = ChainGen(32, 8)
    seq = 1
    while (seq - 1) * 32 < cfg.query_blocks:
        tokens, hashes, parent = gen.next()
        for ix in sides.values():
            ix.apply_stored(seq, tokens, hashes, parent)
        seq += 1
    last = seq - 1
    for ix in sides.values():  # warm: applied and dump cached
        ix.get_events_json(None, None)
    samples: dict[str, list[int]] = {}
    info: dict[str, Any] = {}
    bodies: dict[str, dict[str, str]] = {name: {} for name in sides}
    names = list(sides)
    for rnd in range(cfg.query_rounds):
        order = names[rnd % len(names):] + names[: rnd % len(names)]
        # the fresh dump: an id gap (one Removed of an unknown hash at last+2) invalidates both caches
        for ix in sides.values():
            ix.apply_removed(last + 2, [1])
        last += 2

        def timed(case: str, start: int | None, end: int | None, reps: int, order: list[str] = order) -> None:
            for name in order:
                ix = sides[name]
                for _ in range(reps):
                    t0 = time.perf_counter_ns()
                    body = ix.get_events_json(start, end)
                    samples.setdefault(f"{case}/{name}", []).append(time.perf_counter_ns() - t0)
                bodies[name][case] = body

        timed("dump_fresh", None, None, 1)
        timed("dump_cached", None, None, 2)
        # ten new Stored events of 32 blocks x 32 tokens: the newest ten ids, what an Events answer carries
        for _ in range(10):
            tokens, hashes, parent = gen.next()
            last += 1
            for ix in sides.values():
                ix.apply_stored(last, tokens, hashes, parent)
        timed("events10", last - 9, last, cfg.query_n)
        timed("toonew", last + 10, last + 20, cfg.query_n)
        timed("invalid", last, last - 5, cfg.query_n)
    for name in sides:
        info[name] = {case: {"bytes": len(b.encode()), "variant": variant(b),
                             "events": len(json.loads(b)[variant(b)].get("events", []))
                             if variant(b) in ("Events", "TreeDump") else 0}
                      for case, b in bodies[name].items()}
    if REF:
        info["identical"] = {case: same_reply(bodies["kvshm"][case], bodies["ref"][case]) for case in bodies["kvshm"]}
    kv.shutdown()
    if REF:
        sides["ref"].shutdown()
    return {"blocks": cfg.query_blocks, "events_applied": last, "info": info,
            "summary": {k: summary(v) for k, v in samples.items()},
            "cdf": {k: sorted(v) for k, v in samples.items()}}


# --- deployment -------------------------------------------------------------------------------------------------
class Traffic(threading.Thread):
    """A recovering consumer: paced GETs of /kv_recover (Events for the 10 newest ids; every dump_every-th a
    TreeDump), each on a new connection."""

    def __init__(self, addr: str, rate: float, dump_every: int, seconds: float, last: int) -> None:
        super().__init__(daemon=True)
        self.addr, self.rate, self.dump_every, self.seconds, self.last = addr, rate, dump_every, seconds, last
        self.lat: dict[str, list[int]] = {"Events": [], "TreeDump": []}
        self.other: dict[str, int] = {}
        self.dump_bytes = 0

    def run(self) -> None:
        t_end = time.perf_counter() + self.seconds
        nxt = time.perf_counter()
        i = 0
        while True:
            now = time.perf_counter()
            if now >= t_end:
                return
            if nxt > now:
                time.sleep(nxt - now)
            nxt += 1.0 / self.rate
            dump = i % self.dump_every == self.dump_every - 1
            i += 1
            path = "/kv_recover" if dump else f"/kv_recover?start={self.last - 9}&end={self.last}"
            r = http_get(f"http://{self.addr}{path}", 120.0)
            v = variant(r.body) if r.status == 200 else f"HTTP {r.status}"
            if v in self.lat:
                self.lat[v].append(int(r.seconds * 1e9))
                self.last = max(self.last, last_event_id(r.body))
                if v == "TreeDump":
                    self.dump_bytes = len(r.body)
            else:
                self.other[v] = self.other.get(v, 0) + 1


def deployment(cfg: argparse.Namespace) -> dict[str, Any]:
    if not REF:
        SKIPPED.append("deployment (engine-served /kv_recover from the reference): kvshm side only")
    log(f"deployment: kvshmd --http vs engine-served ThreadingHTTPServer, {cfg.deploy_blocks} resident blocks")
    d = shared_daemon(cfg.kvshmd)
    engines: dict[str, tuple[Child, str]] = {}  # name -> (engine, the address answering its /kv_recover)
    try:
        kv = Child("engine", "--kind", "kvshm", "--socket", str(d.socket), "--blocks", str(cfg.deploy_blocks))
        engines["kvshm"] = (kv, d.http)
        if REF:
            port = free_port()
            ref = Child("engine", "--kind", "ref", "--port", str(port), "--blocks", str(cfg.deploy_blocks))
            engines["ref"] = (ref, f"127.0.0.1:{port}")
        res: dict[str, Any] = {name: {"quiet": [], "traffic": [], "lat": {"Events": [], "TreeDump": []},
                                      "other": {}, "daemon_cpu_s": {"quiet": 0.0, "traffic": 0.0}}
                               for name in engines}
        # idle latency, requests alternating between the two endpoints
        idle: dict[str, list[int]] = {}
        for i in range(cfg.deploy_idle_n):
            for name, (child, addr) in engines.items():
                last = int(child.first["last"])
                path = "/kv_recover" if i % 10 == 9 else f"/kv_recover?start={last - 9}&end={last}"
                r = http_get(f"http://{addr}{path}", 120.0)
                idle.setdefault(f"{variant(r.body)}/{name}", []).append(int(r.seconds * 1e9))
                if i == cfg.deploy_idle_n - 1:
                    res[name]["dump_bytes"] = len(http_get(f"http://{addr}/kv_recover", 120.0).body)
        names = list(engines)
        for rnd in range(cfg.deploy_rounds):
            order = names[rnd % len(names):] + names[: rnd % len(names)]
            for name in order:
                child, addr = engines[name]
                for phase in ("quiet", "traffic"):
                    last = int(child.call({"op": "last"})["last"])
                    tr = Traffic(addr, cfg.deploy_qps, cfg.deploy_dump_every, cfg.deploy_seconds, last)
                    c0 = proc_cpu_s(d.pid)
                    m0 = machine_ticks()
                    child.send({"op": "publish", "seconds": cfg.deploy_seconds, "rate": cfg.deploy_pub_rate})
                    if phase == "traffic":
                        tr.start()
                    out = child.recv()
                    if phase == "traffic":
                        tr.join()
                        for k, v in tr.lat.items():
                            res[name]["lat"][k].extend(v)
                        for k2, c in tr.other.items():
                            res[name]["other"][k2] = res[name]["other"].get(k2, 0) + c
                    res[name]["daemon_cpu_s"][phase] += proc_cpu_s(d.pid) - c0
                    out["machine_busy_pct"] = busy_pct(m0, machine_ticks())
                    res[name][phase].append(out)
        summ: dict[str, Any] = {}
        for name, r in res.items():
            s: dict[str, Any] = {"dump_bytes": r.get("dump_bytes", 0), "other_replies": r["other"]}
            for phase in ("quiet", "traffic"):
                stored = [x for o in r[phase] for x in o["stored_ns"]]
                cpu = sum(o["cpu_s"] for o in r[phase])
                wall = sum(o["wall_s"] for o in r[phase])
                s[phase] = {"apply_stored": summary(stored), "engine_cpu_pct": 100 * cpu / wall,
                            "machine_busy_pct": sum(o["machine_busy_pct"] for o in r[phase]) / len(r[phase]),
                            "daemon_cpu_pct": 100 * r["daemon_cpu_s"][phase] / wall if name == "kvshm" else 0.0}
            for k, v in r["lat"].items():
                s[f"http_{k}"] = summary(v)
                s[f"cdf_{k}"] = sorted(v)
            summ[name] = s
        return {"blocks": cfg.deploy_blocks, "pub_rate": cfg.deploy_pub_rate, "qps": cfg.deploy_qps,
                "dump_every": cfg.deploy_dump_every, "seconds": cfg.deploy_seconds, "rounds": cfg.deploy_rounds,
                "idle": {k: summary(v) for k, v in idle.items()}, "sides": summ}
    finally:
        for child, _ in engines.values():
            child.close()
        d.stop(30.0)


# --- zmq ---------------------------------------------------------------------------------------------------------
def zmq(cfg: argparse.Namespace) -> dict[str, Any]:
    log("zmq: engine cost per KV-event batch (a) own publisher + reference, (b) own publisher + kvshm, (c) kvshmd "
        "publishing; publish-to-subscriber latency")
    out = zmq_bench.run(cfg)
    SKIPPED.extend(out["skipped"])
    return out


# --- scale: resident blocks -------------------------------------------------------------------------------------
def ingest_rate(kv: Any, pid: int, seq: int, n_events: int) -> tuple[float, int]:
    """Stops kvshmd, publishes n_events (Stored/Removed pairs of 32x32) into the ring, resumes it and times until a
    query (whose barrier waits for every event published before it) returns: events per second."""
    gen = ChainGen(32, 1, base=1 << 52)
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(n_events // 2):
            tokens, hashes, parent = gen.next()
            kv.apply_stored(seq, tokens, hashes, parent)
            kv.apply_removed(seq + 1, hashes)
            seq += 2
    finally:
        t0 = time.perf_counter()
        os.kill(pid, signal.SIGCONT)
    kv.get_events_json(seq - 1, None)
    return (n_events // 2 * 2) / (time.perf_counter() - t0), seq


def scale(cfg: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) for s in cfg.scale_sizes.split(",")]
    log(f"scale: resident blocks {sizes}")
    d = shared_daemon(cfg.kvshmd)  # shared, so its /metrics tells the Go heap apart from RSS
    kv = LocalIndexer(13, BS, ring_bytes=256 << 20, socket_path=str(d.socket))
    ring = kv._ring  # noqa: SLF001 - the bench reads the ring's fill

    def pace(seq: int) -> None:
        """Keeps the publisher within reach of kvshmd: a query barrier (everything published is applied) and, as
        applied records stay in the ring until a checkpoint releases them, a wait while the ring is 3/4 full."""
        kv.get_events_json(seq, seq)
        while (st := ring.stats())["used"] > st["capacity"] * 3 // 4:
            time.sleep(0.005)
    holder = Child("holder") if REF else None
    pid = d.pid
    time.sleep(0.2)
    base_rss = rss_bytes(pid, "RssAnon")
    gen = ChainGen(256, 1)
    seq, blocks = 1, 0
    points: list[dict[str, Any]] = []
    try:
        for n in sizes:
            t_step = time.perf_counter()
            if points and n >= 10_000_000:
                est = points[-1]["step_s"] * n / points[-1]["blocks"]
                if est > cfg.scale_budget_s:
                    SKIPPED.append(f"TreeDump/memory at {n:,} resident blocks: the {points[-1]['blocks']:,} step "
                                   f"took {points[-1]['step_s']:.0f} s, so this one would take ~{est:.0f} s "
                                   f"(> {cfg.scale_budget_s:.0f} s budget; raise SCALE_BUDGET or SCALE_SIZES)")
                    break
            log(f"scale: filling to {n:,} blocks")
            t0 = time.perf_counter()
            while blocks < n:
                tokens, hashes, parent = gen.next()
                kv.apply_stored(seq, tokens, hashes, parent)
                seq += 1
                blocks += len(hashes)
                if seq % 32 == 0:
                    pace(seq - 1)
            kv.get_events_json(seq - 1, None)
            fill_kv = time.perf_counter() - t0
            p: dict[str, Any] = {"blocks": n, "fill_s_kvshm": fill_kv}
            if holder:
                p["fill_s_ref"] = holder.call({"op": "fill", "blocks": n})["seconds"]
            rates = []
            for _ in range(3):
                rate, seq = ingest_rate(kv, pid, seq, cfg.ingest_events)
                rates.append(rate)
            rate = sorted(rates)[1]  # the median of three bursts
            p["ingest_events_per_s"] = rate
            p["ingest_blocks_per_s"] = rate / 2 * 32  # Stored events carry 32 blocks, Removed ones 32 hashes
            dumps: dict[str, list[int]] = {}
            rounds = cfg.dump_rounds if n < 1_000_000 else 2
            for rnd in range(rounds):
                sides = ["kvshm", "kvshm_http", "ref"] if holder else ["kvshm", "kvshm_http"]
                if rnd % 2:
                    sides.reverse()
                for side in sides:
                    for fresh in (True, False):
                        key = f"{'fresh' if fresh else 'cached'}/{side}"
                        if side == "kvshm":
                            if fresh:
                                kv.apply_removed(seq + 1, [1])
                                seq += 2
                            t0n = time.perf_counter_ns()
                            body = kv.get_events_json(None, None)
                            dumps.setdefault(key, []).append(time.perf_counter_ns() - t0n)
                            p["dump_bytes_kvshm"] = len(body)
                            del body
                        elif side == "kvshm_http":  # the same daemon's answer to a consumer's GET
                            if fresh:
                                kv.apply_removed(seq + 1, [1])
                                seq += 2
                                kv.get_events_json(seq - 1, seq - 1)  # applied, so the GET times the dump alone
                            t0n = time.perf_counter_ns()
                            got = http_get(d.url("/kv_recover"), 120.0)
                            dumps.setdefault(key, []).append(time.perf_counter_ns() - t0n)
                            assert got.status == 200, (got.status, got.error)
                            del got
                        else:
                            assert holder is not None
                            r = holder.call({"op": "dump", "fresh": fresh})
                            dumps.setdefault(key, []).append(r["ns"])
                            p["dump_bytes_ref"] = r["bytes"]
            p["dump"] = {k: summary(v) for k, v in dumps.items()}
            gc.collect()
            time.sleep(0.2)
            p["rss_kvshm"] = rss_bytes(pid, "RssAnon")
            metrics = http_get(d.metrics_url, 120.0).text
            for name in ("go_memstats_heap_alloc_bytes", "go_memstats_heap_inuse_bytes"):
                m = re.search(rf"^{name} (\S+)$", metrics, re.M)
                p[name] = float(m.group(1)) if m else float("nan")
            p["bytes_per_block_kvshm"] = (p["rss_kvshm"] - base_rss) / n
            if holder:
                r = holder.call({"op": "rss"})
                p["rss_ref"] = r["rss"]
                p["bytes_per_block_ref"] = (r["rss"] - r["base_rss"]) / n
            p["dropped_kvshm"] = kv.stats()["dropped_events"]
            p["step_s"] = time.perf_counter() - t_step
            points.append(p)
            log(f"scale: {n:,} blocks done in {p['step_s']:.1f} s")
    finally:
        kv.shutdown()
        d.stop(30.0)
        if holder:
            holder.close()
    return {"sizes": sizes, "points": points, "daemon_base_rss": base_rss, "ingest_events": cfg.ingest_events}


# --- scale: attached workers ------------------------------------------------------------------------------------
class WorkerQueries(threading.Thread):
    """Events queries for the 10 newest ids of a random worker, over HTTP, while the workers publish."""

    def __init__(self, addr: str, wids: list[int], qps: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.addr, self.wids, self.qps, self.stop = addr, wids, qps, stop
        self.lat: list[int] = []
        self.other: dict[str, int] = {}

    def run(self) -> None:
        rng = random.Random(2)
        known: dict[int, int] = {}
        while not self.stop.wait(1.0 / self.qps):
            w = rng.choice(self.wids)
            last = known.get(w)
            start = 1 << 40 if last is None else max(1, last - 9)
            r = http_get(f"http://{self.addr}/workers/{w}/kv_recover?start={start}", 120.0)
            if r.status != 200:
                self.other[f"HTTP {r.status}"] = self.other.get(f"HTTP {r.status}", 0) + 1
                continue
            obj = r.json()
            v = next(iter(obj))
            if v == "TooNew":
                known[w] = int(obj[v]["newest_available"])
            elif v == "Events":
                known[w] = int(obj[v]["last_event_id"])
                if last is not None:
                    self.lat.append(int(r.seconds * 1e9))
            else:
                self.other[v] = self.other.get(v, 0) + 1


def workers(cfg: argparse.Namespace) -> dict[str, Any]:
    """One shared kvshmd per run: ``workers`` attached streams publishing at ``rate`` events/s each while a consumer
    queries; then, without queries (what the streams themselves cost kvshmd), the most workers at the low
    rate and attached idle (rate 0), each after kvshmd's own CPU with nothing attached, measured in the same daemon
    for ``--worker-empty-seconds`` (the baseline)."""
    counts = [int(s) for s in cfg.worker_counts.split(",")]
    log(f"workers: one shared kvshmd, {counts} attached workers at {cfg.worker_rate:.0f} events/s each")
    points = []
    runs = [(w, cfg.worker_rate) for w in counts]
    if cfg.worker_low_rate > 0:  # many streams that publish rarely: the daemon's idle strategy per stream
        runs.append((max(counts), cfg.worker_low_rate))
    if cfg.worker_idle:  # many streams attached that publish nothing
        runs.append((max(counts), 0.0))
    for w, rate in runs:
        d = shared_daemon(cfg.kvshmd)
        pubs: list[Child] = []
        queries = rate == cfg.worker_rate
        try:
            empty_pct = None
            if not queries:
                time.sleep(0.3)
                c0, t0 = proc_cpu_s(d.pid), time.perf_counter()
                time.sleep(cfg.worker_empty_seconds)
                empty_pct = 100 * (proc_cpu_s(d.pid) - c0) / (time.perf_counter() - t0)
            procs = min(w, cfg.worker_procs)
            wids = list(range(100, 100 + w))
            for i in range(procs):
                mine = wids[i::procs]
                pubs.append(Child("publisher", "--socket", str(d.socket), "--workers", ",".join(map(str, mine)),
                                  "--ring-bytes", str(cfg.worker_ring_bytes)))
            time.sleep(0.3)
            rss0 = rss_bytes(d.pid, "RssAnon")
            stop = threading.Event()
            q = WorkerQueries(d.http, wids, cfg.worker_qps, stop)
            c0 = proc_cpu_s(d.pid)
            m0 = machine_ticks()
            t0 = time.perf_counter()
            for pb in pubs:
                pb.send({"op": "publish", "seconds": cfg.worker_seconds, "rate": rate})
            if queries:
                q.start()
            outs = [pb.recv() for pb in pubs]
            busy = busy_pct(m0, machine_ticks())
            stop.set()
            if queries:
                q.join()
            # every published event applied? (a query's barrier waits for the drain)
            from kvshm._client import Client

            with Client(str(d.socket)) as c:
                st = c.stats(None)["streams"]
            wall = time.perf_counter() - t0
            cpu = proc_cpu_s(d.pid) - c0
            events = sum(sum(o["events"]) for o in outs)
            applied = sum(int(s["events_received"]) for s in st)
            pub_wall = max(o["wall_s"] for o in outs)
            points.append({
                "workers": w, "rate": rate, "publisher_procs": procs, "events": events, "applied": applied,
                "events_per_s_per_worker": events / pub_wall / w, "blocks_per_s_total": events / 2 * 32 / pub_wall,
                "dropped": sum(o["dropped"] for o in outs), "max_behind_s": max(o["max_behind_s"] for o in outs),
                "publisher_cpu_pct": 100 * sum(o["cpu_s"] for o in outs) / pub_wall,
                "daemon_cpu_pct": 100 * cpu / wall, "daemon_cpu_us_per_event": 1e6 * cpu / max(1, applied),
                "rss_start": rss0, "rss_end": rss_bytes(d.pid, "RssAnon"), "ring_bytes": cfg.worker_ring_bytes,
                "vmrss_end": rss_bytes(d.pid, "VmRSS"),
                "query": summary(q.lat), "query_other": q.other, "machine_busy_pct": busy, "queries": queries,
                "empty_daemon_cpu_pct": empty_pct,
            })
            log(f"workers: {w} at {rate:.0f} events/s done")
        finally:
            for pb in pubs:
                pb.close()
            d.stop(30.0)
    return {"rate": cfg.worker_rate, "seconds": cfg.worker_seconds, "qps": cfg.worker_qps, "points": points}


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "build" / "bench" / "results.json"))
    p.add_argument("--only", default="publish,zmq,queries,deployment,scale,workers")
    p.add_argument("--kvshmd", default=env("KVSHMD_BIN", str(ROOT / "build" / "kvshmd")))
    p.add_argument("--publish-sizes", default=env("PUBLISH_SIZES", "1,4,16,32,64,128"))
    p.add_argument("--publish-rounds", type=int, default=int(env("PUBLISH_ROUNDS", "20")))
    p.add_argument("--publish-n", type=int, default=int(env("PUBLISH_N", "200")))
    p.add_argument("--query-blocks", type=int, default=int(env("QUERY_BLOCKS", "100000")))
    p.add_argument("--query-rounds", type=int, default=int(env("QUERY_ROUNDS", "15")))
    p.add_argument("--query-n", type=int, default=int(env("QUERY_N", "40")))
    p.add_argument("--deploy-blocks", type=int, default=int(env("DEPLOY_BLOCKS", "100000")))
    p.add_argument("--deploy-rounds", type=int, default=int(env("DEPLOY_ROUNDS", "3")))
    p.add_argument("--deploy-seconds", type=float, default=float(env("DEPLOY_SECONDS", "4")))
    p.add_argument("--deploy-pub-rate", type=float, default=float(env("DEPLOY_PUB_RATE", "1000")))
    p.add_argument("--deploy-qps", type=float, default=float(env("DEPLOY_QPS", "50")))
    p.add_argument("--deploy-dump-every", type=int, default=int(env("DEPLOY_DUMP_EVERY", "10")))
    p.add_argument("--deploy-idle-n", type=int, default=int(env("DEPLOY_IDLE_N", "100")))
    p.add_argument("--scale-sizes", default=env("SCALE_SIZES", "10000,100000,1000000,10000000"))
    p.add_argument("--scale-budget-s", type=float, default=float(env("SCALE_BUDGET", "120")))
    p.add_argument("--dump-rounds", type=int, default=int(env("DUMP_ROUNDS", "6")))
    p.add_argument("--ingest-events", type=int, default=int(env("INGEST_EVENTS", "6000")))
    p.add_argument("--worker-counts", default=env("WORKER_COUNTS", "1,8,64"))
    p.add_argument("--worker-rate", type=float, default=float(env("WORKER_RATE", "400")))
    p.add_argument("--worker-low-rate", type=float, default=float(env("WORKER_LOW_RATE", "10")))
    p.add_argument("--worker-seconds", type=float, default=float(env("WORKER_SECONDS", "6")))
    p.add_argument("--worker-idle", type=int, default=int(env("WORKER_IDLE", "1")),
                   help="1: also measure the most workers attached and idle (rate 0), without queries")
    p.add_argument("--worker-empty-seconds", type=float, default=float(env("WORKER_EMPTY_SECONDS", "3")),
                   help="kvshmd's CPU with nothing attached, before the low-rate and idle runs (their baseline)")
    p.add_argument("--worker-qps", type=float, default=float(env("WORKER_QPS", "50")))
    p.add_argument("--worker-procs", type=int, default=int(env("WORKER_PROCS", "2")))
    p.add_argument("--worker-ring-bytes", type=int, default=int(env("WORKER_RING_BYTES", str(8 << 20))))
    zmq_bench.add_args(p)
    cfg = p.parse_args()
    os.environ.setdefault("KVSHMD_BIN", cfg.kvshmd)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "pybind" / "src"),
                                                             os.environ.get("PYTHONPATH")]))
    if not REF:
        SKIPPED.append(f"every comparison with the reference module (kvshm_conformance not importable: {REF_ERROR});"
                       " build it with cargo (make bench does when cargo is on PATH)")
    out: dict[str, Any] = {"machine": machine(), "config": vars(cfg)}
    t0 = time.perf_counter()
    sections: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "publish": publish, "queries": queries, "deployment": deployment, "scale": scale, "workers": workers,
        "zmq": zmq}
    for name in cfg.only.split(","):
        ts = time.perf_counter()
        out[name] = sections[name](cfg)
        out[name]["elapsed_s"] = time.perf_counter() - ts
    out["machine"]["loadavg_end"] = os.getloadavg()
    out["elapsed_s"] = time.perf_counter() - t0
    out["skipped"] = SKIPPED
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.out).write_text(json.dumps(out))
    log(f"wrote {cfg.out} in {out['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
