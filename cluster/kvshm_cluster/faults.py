"""The faults, each injected into a cluster under load, healed, and judged on every router.

Each fault returns its rows; the load runs again afterwards. Durations are in engine steps, so that a partition,
a router down, a stall outlast the replay window (``buffer_steps`` batches) whatever the rate. A fault on "router 1"
hits router 1 of each kind at once (:meth:`.Cluster.faulted`).

What ``--strict`` requires of kvshm (:func:`must_converge`): every row, for both router kinds. Dynamo's router
replays (and snapshots past the window make each row exact); llm-d-router at ebab687927f5 replays too, but takes only
a reply whose seqs run from the one it asked for without a gap (cluster/llmd/doc.go): kvshmd gives it that with
contiguous replies and, in a cluster with llm-d routers, wire seqs from 1 (``--zmq-seq-base zero``;
docs/replay-snapshots.md).
Measured with llm-d-kv-cache at 7be76e1 before (no replay at all), llm-d was exact only after steady load, a stall
and an engine restart.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from .cluster import Cluster, Verdict


@dataclass
class Row:
    fault: str
    publisher: str
    router: int
    extra: int
    missing: int
    converged: bool
    seconds: float | None
    truth_blocks: int
    note: str = ""
    kind: str = "dynamo"


def _judge(c: Cluster, fault: str, healed: float, note: str = "") -> list[Row]:
    c.idle()
    rows = [Row(fault, c.cfg.publisher, v.router, v.extra, v.missing, v.converged, v.seconds, c.truth_blocks(),
                (note + " " + v.note).strip(), v.kind) for v in c.judge(healed)]
    for r in rows:
        secs = f"{r.seconds:.1f} s" if r.seconds is not None else "no"
        print(f"  {fault:<24} {c.cfg.publisher:<6} {r.kind} {r.router}: extra {r.extra}, missing {r.missing}, "
              f"converged {secs} (truth {r.truth_blocks}) {r.note}", flush=True)
    c.rebase()
    c.run()
    time.sleep(min(3.0, window_s(c, 0.5)))  # caches refill before the next fault
    return rows


def window_s(c: Cluster, factor: float = 1.5) -> float:
    """Seconds of load that publish ``factor`` replay windows of batches per producer."""
    return max(2.0, factor * c.cfg.buffer_steps / c.cfg.hz)


def steady(c: Cluster) -> list[Row]:
    time.sleep(2.0)
    return _judge(c, "steady", time.monotonic())


def router_restart_early(c: Cluster) -> list[Row]:
    """Router 1 SIGKILLed and restarted while every stream still fits in the replay window (right after start)."""
    for rt in c.faulted():
        rt.kill()
    time.sleep(c.rng.uniform(0.1, 0.5))
    for rt in c.faulted():
        c.start_router(rt)
    return _judge(c, "router restart (in window)", time.monotonic())


def partition(c: Cluster) -> list[Row]:
    """Node 1 and router 1 cut apart (TCP reset both ways) for 1.5 replay windows."""
    for rt in c.faulted():
        c.net.partition(1, rt.ns_index)
    time.sleep(window_s(c))
    for rt in c.faulted():
        c.net.heal(1, rt.ns_index)
    return _judge(c, "partition > window", time.monotonic())


def router_restart_late(c: Cluster) -> list[Row]:
    """Router 1 down for a random time past the replay window."""
    for rt in c.faulted():
        rt.kill()
    time.sleep(window_s(c, c.rng.uniform(1.2, 2.0)))
    for rt in c.faulted():
        c.start_router(rt)
    return _judge(c, "router restart (late)", time.monotonic())


def slow_router(c: Cluster) -> list[Row]:
    """Router 1 SIGSTOPped for 1.5 replay windows, then SIGCONT."""
    for rt in c.faulted():
        rt.signal(signal.SIGSTOP)
    time.sleep(window_s(c))
    for rt in c.faulted():
        rt.signal(signal.SIGCONT)
    return _judge(c, "slow router (SIGSTOP)", time.monotonic())


def kvshmd_restart(c: Cluster) -> list[Row]:
    """Node 1's kvshmd SIGKILLed and restarted 1 s later; its engines keep publishing into their rings."""
    n = c.nodes[0]
    if n.kvshmd is None:
        return [Row("kvshmd SIGKILL+restart", c.cfg.publisher, rt.index, 0, 0, True, None, 0, "n/a", rt.kind)
                for rt in c.routers]
    n.kvshmd.kill()
    time.sleep(1.0)
    c.start_kvshmd(n)
    return _judge(c, "kvshmd SIGKILL+restart", time.monotonic())


def engine_restart(c: Cluster) -> list[Row]:
    """Node 1's first producer SIGKILLed and a new one started on the same (worker, rank): an empty cache."""
    n = c.nodes[0]
    key = next(iter(n.producers))
    old = n.producers[key]
    old.proc.kill()
    time.sleep(0.5)
    p = c.start_producer(n, key[0] - 100 * n.index, key[1], old.life + 1, wait=True)
    p.proc.ask({"op": "run", "hz": c.cfg.hz}, 30.0)
    time.sleep(1.0)
    return _judge(c, "engine SIGKILL+restart", time.monotonic())


FAULTS: list[tuple[str, Callable[[Cluster], list[Row]]]] = [
    ("router-restart-early", router_restart_early),
    ("steady", steady),
    ("partition", partition),
    ("router-restart-late", router_restart_late),
    ("slow-router", slow_router),
    ("kvshmd-restart", kvshmd_restart),
    ("engine-restart", engine_restart),
]


def must_converge(r: Row) -> bool:
    """Whether ``--strict`` requires this row to converge: every kvshm row."""
    return r.publisher == "kvshm" and r.note != "n/a"


def verdicts_ok(vs: list[Verdict]) -> bool:
    return all(v.converged for v in vs)
