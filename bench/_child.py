"""Child processes of recovery_bench.py, driven by JSON lines on stdin; each answers one JSON line per command.

    python bench/_child.py engine --kind kvshm --socket S --blocks N
    python bench/_child.py engine --kind ref --port P --blocks N
    python bench/_child.py holder            # the reference module holding a scale-curve tree
    python bench/_child.py publisher --socket S --workers 1,2,3 --ring-bytes B

engine: an inference engine's KV-event publisher with the recovery index of one kind. kvshm publishes into
LocalIndexer (a shared kvshmd serves /kv_recover); ref holds Dynamo's LocalKvIndexer (kvshm_conformance) and serves
/kv_recover itself through ThreadingHTTPServer (kvshm_testkit.serve_kv_recover), as the vLLM fork does. Command
{"op":"publish","seconds":T,"rate":R}: Stored/Removed pairs at R events/s, each apply_stored timed; replies with the
samples and the process's CPU seconds (for ref that includes its HTTP threads).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from _common import BS, ChainGen, commands, cpu_self, reply  # noqa: E402

from kvshm_testkit import rss_bytes, serve_kv_recover  # noqa: E402


class Indexer(Protocol):
    def apply_stored(self, seq: int, token_ids: list[int], block_hashes: list[int],
                     parent_hash: int | None = None) -> None: ...
    def apply_removed(self, seq: int, block_hashes: list[int]) -> None: ...
    def get_events_json(self, start: int | None = None, end: int | None = None) -> str: ...


def fill(ix: Indexer, gen: ChainGen, seq: int, blocks: int, pace: Any = None) -> int:
    """Publishes Stored events from gen until `blocks` blocks are stored; returns the next seq."""
    stored = 0
    while stored < blocks:
        tokens, hashes, parent = gen.next()
        ix.apply_stored(seq, tokens, hashes, parent)
        seq += 1
        stored += len(hashes)
        if pace is not None and seq % 64 == 0:
            pace()
    return seq


def ring_pacer(ix: Any) -> Any:
    """For a kvshm LocalIndexer: waits while its ring is more than a quarter full (the daemon catches up)."""
    ring = ix._ring  # noqa: SLF001 - the bench reads the ring's fill

    def pace() -> None:
        while True:
            st = ring.stats()
            if st["used"] < st["capacity"] // 4:
                return
            time.sleep(0.002)

    return pace


def engine(args: argparse.Namespace) -> None:
    ix: Any
    srv = None
    pace = None
    if args.kind == "kvshm":
        from kvshm import LocalIndexer

        ix = LocalIndexer(1, BS, socket_path=args.socket, ring_bytes=args.ring_bytes)
        pace = ring_pacer(ix)
    else:
        import kvshm_conformance

        ix = kvshm_conformance.LocalIndexer(1, BS)
        srv = serve_kv_recover(ix, "127.0.0.1", args.port)
    seq = fill(ix, ChainGen(32, 8), 1, args.blocks, pace)
    hot = ChainGen(32, 1, base=1 << 50)
    reply({"ready": True, "last": seq - 1, "pid": os.getpid()})
    for cmd in commands():
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "last":
            reply({"last": seq - 1})
            continue
        seconds, rate = float(cmd["seconds"]), float(cmd["rate"])
        period = 2.0 / rate  # one Stored + one Removed per period
        samples: list[int] = []
        gc.collect()
        c0, w0 = cpu_self(), time.perf_counter()
        deadline = w0 + seconds
        nxt = w0
        while True:
            now = time.perf_counter()
            if now >= deadline:
                break
            if nxt > now:
                time.sleep(nxt - now)
            nxt += period
            tokens, hashes, parent = hot.next()
            t0 = time.perf_counter_ns()
            ix.apply_stored(seq, tokens, hashes, parent)
            samples.append(time.perf_counter_ns() - t0)
            ix.apply_removed(seq + 1, hashes)
            seq += 2
        wall = time.perf_counter() - w0
        reply({"stored_ns": samples, "cpu_s": cpu_self() - c0, "wall_s": wall, "last": seq - 1})
    if srv is not None:
        srv.shutdown()
    if hasattr(ix, "shutdown"):
        ix.shutdown()


def holder(_: argparse.Namespace) -> None:
    """The reference module with a growing tree of 256-block chains: fill / dump / rss commands."""
    import kvshm_conformance

    ix = kvshm_conformance.LocalIndexer(1, BS)
    gen = ChainGen(256, 1)
    seq = 1
    blocks = 0
    gc.collect()
    base_rss = rss_bytes(os.getpid(), "RssAnon")
    reply({"ready": True, "rss": base_rss})
    for cmd in commands():
        op = cmd["op"]
        if op == "quit":
            break
        if op == "fill":
            t0 = time.perf_counter()
            seq = fill(ix, gen, seq, cmd["blocks"] - blocks)
            blocks = cmd["blocks"]
            ix.get_events_json(seq - 1, None)  # the actor has applied everything queued before
            reply({"seconds": time.perf_counter() - t0, "last": seq - 1})
        elif op == "dump":
            if cmd["fresh"]:
                # An id gap invalidates the dump cache (Dynamo 1.6.1 and kvshm alike): the next dump is built anew.
                ix.apply_removed(seq + 1, [1])
                seq += 2
            t0 = time.perf_counter_ns()
            body = ix.get_events_json(None, None)
            ns = time.perf_counter_ns() - t0
            reply({"ns": ns, "bytes": len(body), "variant": body[2:10]})
        elif op == "rss":
            gc.collect()
            reply({"rss": rss_bytes(os.getpid(), "RssAnon"), "base_rss": base_rss})


def publisher(args: argparse.Namespace) -> None:
    """Several workers' LocalIndexers attached to one shared daemon, publishing Stored/Removed pairs at a paced
    rate each (round robin) until told to stop."""
    from kvshm import LocalIndexer

    wids = [int(w) for w in args.workers.split(",")]
    ixs = [LocalIndexer(w, BS, socket_path=args.socket, ring_bytes=args.ring_bytes) for w in wids]
    deadline = time.monotonic() + 30
    while not all(ix.stats()["attached"] for ix in ixs):
        if time.monotonic() > deadline:
            raise SystemExit("publisher: workers did not attach within 30 s")
        time.sleep(0.01)
    reply({"ready": True})
    gens = [ChainGen(32, 1, base=(w + 1) << 44) for w in wids]
    seq = [1] * len(ixs)
    for cmd in commands():
        if cmd["op"] == "quit":
            break
        seconds, rate = float(cmd["seconds"]), float(cmd["rate"])
        counts = [0] * len(ixs)
        if rate <= 0:  # attached and idle: the daemon's cost of streams that publish nothing
            c0, w0 = cpu_self(), time.perf_counter()
            time.sleep(seconds)
            reply({"events": counts, "last": [s - 1 for s in seq], "cpu_s": cpu_self() - c0,
                   "wall_s": time.perf_counter() - w0, "dropped": 0, "max_behind_s": 0.0})
            continue
        period = 2.0 / (rate * len(ixs))  # one pair per period, round robin over the workers
        c0, w0 = cpu_self(), time.perf_counter()
        deadline2 = w0 + seconds
        nxt = w0
        k = 0
        behind = 0.0
        while True:
            now = time.perf_counter()
            if now >= deadline2:
                break
            if nxt > now:
                time.sleep(nxt - now)
            else:
                behind = max(behind, now - nxt)
            nxt += period
            i = k % len(ixs)
            k += 1
            tokens, hashes, parent = gens[i].next()
            ixs[i].apply_stored(seq[i], tokens, hashes, parent)
            ixs[i].apply_removed(seq[i] + 1, hashes)
            seq[i] += 2
            counts[i] += 2
        wall = time.perf_counter() - w0
        dropped = sum(int(ix.stats()["dropped_events"] or 0) for ix in ixs)
        reply({"events": counts, "last": [s - 1 for s in seq], "cpu_s": cpu_self() - c0, "wall_s": wall,
               "dropped": dropped, "max_behind_s": behind})
    for ix in ixs:
        ix.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("engine")
    e.add_argument("--kind", choices=["kvshm", "ref"], required=True)
    e.add_argument("--socket", default="")
    e.add_argument("--port", type=int, default=0)
    e.add_argument("--blocks", type=int, default=100_000)
    e.add_argument("--ring-bytes", type=int, default=64 << 20)
    sub.add_parser("holder")
    pb = sub.add_parser("publisher")
    pb.add_argument("--socket", required=True)
    pb.add_argument("--workers", required=True)
    pb.add_argument("--ring-bytes", type=int, default=8 << 20)
    args = p.parse_args()
    {"engine": engine, "holder": holder, "publisher": publisher}[args.mode](args)


if __name__ == "__main__":
    main()
