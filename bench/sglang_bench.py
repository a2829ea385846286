"""SGLang's engine cost per published KV-event batch: kvshm's plugin against SGLang's own publisher, same batches,
same run (``make bench-sglang``; the SGLang venv of ``make sglangenv``).

    make bench-sglang    # = PYTHONPATH=<kvshm wheel site>:testkit build/sglangenv/bin/python bench/sglang_bench.py

Each side runs in its own engine process, shaped as SGLang's scheduler runs it: the scheduler thread builds a
``KVEventBatch`` of SGLang 0.5.23's own structs and calls ``publish`` on the publisher ``EventPublisherFactory``
created from ``--kv-events-config``:

* ``sglang``: SGLang's ``ZmqEventPublisher`` (``"publisher": "zmq"``): ``publish`` puts the batch on a queue, its
  ``zmq-publisher`` thread encodes it with msgspec and sends it on a pyzmq PUB (keeping it for replay);
* ``kvshm``: kvshm's plugin (``"publisher": "kvshm"``, registered by SGLang's own plugin loader): ``publish`` writes
  the batch into the ring on the scheduler thread; the private kvshmd encodes and publishes it;
* ``idle``: the same pacing loop without a publisher (the baseline subtracted from both).

The batches (seeded, the same in every process): the radix tree's shape, one merged BlockStored chain of 4 pages x 16
tokens per batch (signed int64 hashes, its parent the previous chain's last page), and in 3 of 10 batches a
BlockRemoved of 1-4 pages. Paced at ``--rate`` batches/s for ``--seconds`` per round, sides rotated each round; a
pyzmq SUB in this process drains both streams. Per batch: the engine process's CPU (all threads, libzmq's I/O
thread included; getrusage) minus the idle engine's, its scheduler thread's and SGLang's publisher thread's
(pthread CPU clocks), kvshmd's (its threads' schedstat). The figures: kvshm's engine cost / SGLang's (goal <= 0.5x),
and the node's, engine + kvshmd / SGLang's engine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import JsonChild, commands, cpu_self, proc_cpu_s, reply  # noqa: E402
from _report import emit_measured  # noqa: E402

SIDES = ("sglang", "kvshm")
PAGE = 16
GOAL = 0.5


def workload(seed: int, n: int) -> list[list[Any]]:
    """``n`` batches of SGLang's own event structs (module doc)."""
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, StorageMedium

    rng = random.Random(seed)
    out: list[list[Any]] = []
    parent: int | None = None
    live: list[int] = []
    for _ in range(n):
        hashes = [rng.getrandbits(64) - (1 << 63) for _ in range(4)]
        toks = [rng.randrange(1, 150_000) for _ in range(4 * PAGE)]
        batch: list[Any] = [BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks,
                                        block_size=PAGE, lora_id=None, medium=StorageMedium.GPU)]
        parent = None if rng.random() < 0.25 else hashes[-1]
        live.extend(hashes)
        if rng.random() < 0.3 and len(live) > 8:
            k = rng.randint(1, 4)
            gone, live = live[:k], live[k:]
            batch.append(BlockRemoved(block_hashes=gone, medium=StorageMedium.GPU))
        out.append(batch)
    return out


def thread_cpu(ident: int | None) -> float:
    return 0.0 if ident is None else time.clock_gettime(time.pthread_getcpuclockid(ident))


def engine(args: argparse.Namespace) -> None:
    """One side's engine process: {"op": "run", "n", "rate"} publishes the next n batches paced from the main
    (scheduler) thread and replies with its CPU figures."""
    os.environ["KVSHM_KV_BLOCK_SIZE"] = str(PAGE)  # no SGLang server arguments in this process
    from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch
    from sglang.srt.plugins import load_plugins

    load_plugins()  # SGLang's loader runs kvshm's entry point
    pub: Any = None
    daemon_pid: int | None = None
    if args.side != "idle":
        cfg = {"publisher": "zmq" if args.side == "sglang" else "kvshm", "endpoint": args.endpoint,
               "topic": args.side}
        pub = EventPublisherFactory.create(json.dumps(cfg), attn_dp_rank=0)
        core = getattr(getattr(pub, "indexer", None), "_core", None)  # the private kvshmd's pid, for its CPU
        daemon = getattr(core, "daemon", None)
        daemon_pid = getattr(daemon, "pid", None)
    batches = iter(workload(args.seed, args.max_batches))
    main_ident = threading.get_ident()
    reply({"ready": True, "daemon_pid": daemon_pid})
    for cmd in commands():
        if cmd["op"] == "quit":
            break
        todo = [next(batches) for _ in range(int(cmd["n"]))]
        period = 1.0 / float(cmd["rate"])
        pub_thread = next((t.ident for t in threading.enumerate() if t.name == "zmq-publisher"), None)
        gc.collect()
        c_proc, c_main, c_pub = cpu_self(), thread_cpu(main_ident), thread_cpu(pub_thread)
        c_daemon = proc_cpu_s(daemon_pid) if daemon_pid else 0.0
        t0 = time.perf_counter()
        deadline = t0
        for events in todo:
            deadline += period
            if pub is not None:
                pub.publish(KVEventBatch(ts=time.time(), events=events))
            wait = deadline - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        if pub is not None and args.side == "sglang":
            pub._event_queue.join()  # noqa: SLF001 - every queued batch encoded and sent
        reply({"batches": len(todo), "wall_s": time.perf_counter() - t0, "proc_cpu_s": cpu_self() - c_proc,
               "main_cpu_s": thread_cpu(main_ident) - c_main, "pub_cpu_s": thread_cpu(pub_thread) - c_pub,
               "daemon_cpu_s": (proc_cpu_s(daemon_pid) - c_daemon) if daemon_pid else 0.0,
               "errors": getattr(pub, "errors", 0)})
    if pub is not None:
        pub.shutdown()


def drain(endpoints: list[str], stop: threading.Event, got: dict[bytes, int]) -> None:
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    for ep in endpoints:
        sub.connect(ep)
    while not stop.is_set():
        try:
            topic, _, _ = sub.recv_multipart()
        except zmq.Again:
            continue
        got[topic] = got.get(topic, 0) + 1
    sub.close(0)


def main(args: argparse.Namespace) -> dict[str, Any]:
    from kvshm_testkit import free_port

    n = int(args.rate * args.seconds)
    load_start = os.getloadavg()[0]
    ports = {s: free_port() for s in SIDES}
    kids: dict[str, JsonChild] = {}
    stop = threading.Event()
    got: dict[bytes, int] = {}
    drainer = threading.Thread(target=drain, args=([f"tcp://127.0.0.1:{ports[s]}" for s in SIDES], stop, got))
    drainer.start()
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for s in (*SIDES, "idle"):
            ep = f"tcp://*:{ports[s]}" if s != "idle" else ""
            kids[s] = JsonChild([sys.executable, __file__, "engine", "--side", s, "--endpoint", ep,
                                 "--max-batches", str(n * (args.rounds + 1)), "--seed", str(args.seed)])
        for s in SIDES:  # the subscriber joins each stream before the measured rounds
            kids[s].call({"op": "run", "n": n // 4 or 1, "rate": args.rate})
        names = [*SIDES, "idle"]
        for rnd in range(args.rounds):
            for s in names[rnd % len(names):] + names[: rnd % len(names)]:
                runs.setdefault(s, []).append(kids[s].call({"op": "run", "n": n, "rate": args.rate}))
    finally:
        for k in kids.values():
            k.close()
        stop.set()
        drainer.join()

    def per_batch(s: str, key: str) -> float:
        return sum(r[key] for r in runs[s]) / sum(r["batches"] for r in runs[s])

    base = per_batch("idle", "proc_cpu_s")
    base_main = per_batch("idle", "main_cpu_s")
    out: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "rounds": args.rounds,
                           "received": {k.decode(): v for k, v in got.items()},
                           "loadavg": [load_start, os.getloadavg()[0]], "cores": os.cpu_count()}
    for s in SIDES:
        out[s] = {"engine_cpu_us": 1e6 * (per_batch(s, "proc_cpu_s") - base),
                  "scheduler_cpu_us": 1e6 * (per_batch(s, "main_cpu_s") - base_main),
                  "publisher_thread_cpu_us": 1e6 * per_batch(s, "pub_cpu_s"),
                  "kvshmd_cpu_us": 1e6 * per_batch(s, "daemon_cpu_s"),
                  "errors": max(r["errors"] for r in runs[s])}
    sg, kv = out["sglang"], out["kvshm"]
    out["ratio_engine"] = kv["engine_cpu_us"] / sg["engine_cpu_us"]
    out["ratio_node"] = (kv["engine_cpu_us"] + kv["kvshmd_cpu_us"]) / sg["engine_cpu_us"]
    out["goal"] = GOAL
    out["pass"] = out["ratio_engine"] <= GOAL
    return out


def section(r: dict[str, Any], source: str) -> list[str]:
    """bench/RESULTS.md's SGLang section (results_report.py renders it from the committed measurement)."""
    return ["## SGLang: the engine's cost per published batch", "",
            f"From `{source}` (`make bench-sglang`: SGLang 0.5.23 in its venv, both publishers built by SGLang's "
            "`EventPublisherFactory`; bench/sglang_bench.py has the method). Engine CPU per batch with the idle "
            "engine's pacing loop subtracted; kvshmd's CPU beside it.", "", *report(r).splitlines(), ""]


def report(r: dict[str, Any]) -> str:
    sg, kv = r["sglang"], r["kvshm"]
    rows = [
        ("engine process CPU per batch (all threads)", sg["engine_cpu_us"], kv["engine_cpu_us"]),
        ("  of which the scheduler thread", sg["scheduler_cpu_us"], kv["scheduler_cpu_us"]),
        ("  of which SGLang's publisher thread", sg["publisher_thread_cpu_us"], kv["publisher_thread_cpu_us"]),
        ("kvshmd CPU per batch", sg["kvshmd_cpu_us"], kv["kvshmd_cpu_us"]),
        ("node CPU per batch (engine + kvshmd)", sg["engine_cpu_us"], kv["engine_cpu_us"] + kv["kvshmd_cpu_us"]),
    ]
    lines = ["| per published batch | SGLang's own publisher | kvshm plugin |", "|---|---|---|"]
    lines += [f"| {name} | {a:.2f} µs | {b:.2f} µs |" for name, a, b in rows]
    verdict = "PASS" if r["pass"] else "MISS"
    lines.append(f"\nkvshm / SGLang, engine: **{r['ratio_engine']:.2f}×** (goal ≤ {r['goal']}×: {verdict}); node "
                 f"(engine + kvshmd) / SGLang's engine: {r['ratio_node']:.2f}×. {r['rate']:.0f} batches/s, "
                 f"{r['rounds']} rounds × {r['seconds']:.0f} s per side; received {r['received']}; load average "
                 f"{r['loadavg'][0]:.1f} / {r['loadavg'][1]:.1f} at start / end on {r['cores']} cores (the machine "
                 "is shared: the ratio moves with the load).")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    e = sub.add_parser("engine")
    e.add_argument("--side", required=True, choices=[*SIDES, "idle"])
    e.add_argument("--endpoint", default="")
    e.add_argument("--max-batches", type=int, required=True)
    e.add_argument("--seed", type=int, default=27)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "engine":
        engine(a)
    else:
        res = main(a)
        emit_measured(res, report(res), a.out)
