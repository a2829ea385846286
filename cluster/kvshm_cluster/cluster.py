"""The cluster: nodes (a namespace each: a shared ``kvshmd serve`` for kvshm, producers per ``(worker, dp_rank)``)
and routers (a namespace each: ``routers`` of each kind in ``kinds``, :mod:`.router`), built for one publisher
(``kvshm`` or ``vllm``), and the judge. With an ``llmd`` router every producer publishes with llm-d's topic, and
kvshm's in the layout llm-d decodes (wire ``array``).

Worker ids are ``100 * node + w``; rank r of local worker w publishes on ports ``5600 + 20 w + r`` (PUB) and
``5610 + 20 w + r`` (replay), vLLM's rank offset. A router is judged by its ``/dump`` against every producer's
truth, taken when the producers go idle (they then publish only probes, which leave their caches as they were).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvshm_testkit import Kvshmd, Proc, cpu_seconds, extra_missing_keyed

from .gen import BLOCK_SIZE
from .net import Net
from .router import Key, Router, llmd_topic

PUB_BASE = 5600
ROUTER_PORT = 8100
KVSHMD_HTTP_PORT = 9400
REF_HTTP_PORT = 9500  # + 20 w + r


@dataclass(frozen=True)
class Config:
    publisher: str  # "kvshm" or "vllm"
    nodes: int
    workers: int  # per node
    ranks: int  # per worker
    routers: int  # of each kind
    buffer_steps: int
    hz: float  # engine steps per second per producer under load
    capacity: int  # blocks per producer in steady load
    seed: int
    kvshmd: Path
    router_bin: Path
    out: Path
    converge_s: float = 20.0
    ref_http: bool = False  # producers also serve the engine-side /kv_recover (REF_HTTP_PORT)
    kinds: tuple[str, ...] = ("dynamo",)  # router kinds (router.KINDS)
    llmd_bin: Path | None = None  # build/llmd-router, for kind "llmd"


@dataclass
class Producer:
    node: int
    worker: int
    rank: int
    life: int
    proc: Proc


@dataclass
class Verdict:
    """One router's state after a fault against the truth."""

    router: int
    extra: int
    missing: int
    converged: bool
    seconds: float | None
    note: str = ""
    kind: str = "dynamo"


@dataclass
class Node:
    index: int
    ns: str
    ip: str
    dir: Path
    kvshmd: Kvshmd | None = None  # made at its first start
    producers: dict[Key, Producer] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.dir / "kvshmd.sock"


class Cluster:
    def __init__(self, cfg: Config, net: Net) -> None:
        self.cfg = cfg
        self.net = net
        self.rng = random.Random(cfg.seed)
        self.nodes = [Node(i, net.node_ns(i), net.node_ip(i), cfg.out / f"node{i}")
                      for i in range(1, cfg.nodes + 1)]
        self.routers: list[Router] = []
        for kind in cfg.kinds:
            binary = cfg.llmd_bin if kind == "llmd" else cfg.router_bin
            if binary is None:
                raise ValueError(f"no binary for router kind {kind}")
            for i in range(1, cfg.routers + 1):
                j = len(self.routers) + 1
                self.routers.append(Router(i, binary, net.exec(net.router_ns(j)), net.router_ip(j), ROUTER_PORT,
                                           cfg.out / f"router-{kind}{i}.log", kind=kind, ns_index=j))
        self.truth: dict[Key, frozenset[int]] = {}

    # --- processes -----------------------------------------------------------------------------------------

    def start(self) -> None:
        for n in self.nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            if self.cfg.publisher == "kvshm":
                self.start_kvshmd(n)
        for n in self.nodes:
            for w in range(self.cfg.workers):
                for r in range(self.cfg.ranks):
                    self.start_producer(n, w, r, 0)
        for n in self.nodes:
            for p in n.producers.values():
                p.proc.ask(None, 60.0)  # ready
        for rt in self.routers:
            self.start_router(rt)

    def start_kvshmd(self, n: Node) -> None:
        """The node's kvshmd (XDG_RUNTIME_DIR in the node's dir), started or started again, healthy within 30 s."""
        if n.kvshmd is None:
            # llm-d's replay consumer asks from seq 0 when it has none and takes only a reply that starts there: wire
            # seqs from 1, kept across the daemon's restarts by its state dir, and contiguous replies (the default).
            flags = ["--zmq-seq-base", "zero"] if "llmd" in self.cfg.kinds else []
            n.kvshmd = Kvshmd(self.cfg.kvshmd, n.dir, http=f"{n.ip}:{KVSHMD_HTTP_PORT}", flags=flags,
                              socket=n.socket, prefix=self.net.exec(n.ns), name=f"kvshmd {n.index}")
        n.kvshmd.start(30.0)

    def worker_id(self, n: Node, w: int) -> int:
        return 100 * n.index + w

    def ports(self, w: int, r: int) -> tuple[int, int]:
        return PUB_BASE + 20 * w + r, PUB_BASE + 10 + 20 * w + r

    def start_producer(self, n: Node, w: int, r: int, life: int, wait: bool = False) -> Producer:
        wid = self.worker_id(n, w)
        pub, replay = self.ports(w, r)
        argv = [*self.net.exec(n.ns), sys.executable, "-m", "kvshm_cluster.producer", "--mode", self.cfg.publisher,
                "--worker", str(wid), "--rank", str(r), "--life", str(life), "--seed", str(self.cfg.seed),
                "--pub", f"tcp://*:{pub}", "--replay", f"tcp://*:{replay}", "--buffer-steps",
                str(self.cfg.buffer_steps), "--capacity", str(self.cfg.capacity), "--max-seconds", "3600"]
        if self.cfg.publisher == "kvshm":
            argv += ["--socket", str(n.socket)]
        if "llmd" in self.cfg.kinds:
            # llm-d subscribes to topics "kv@" (llmd_topic). kvshm publishes the array layout, which llm-d-router
            # decodes as it does vLLM >= 0.32's field-name maps (the old llm-d-kv-cache decoded arrays only).
            argv += ["--topic", llmd_topic(wid, r), "--wire", "array"]
        if self.cfg.ref_http:
            argv += ["--ref-http", f"{n.ip}:{REF_HTTP_PORT + 20 * w + r}"]
        p = Producer(n.index, wid, r, life, Proc(f"producer {wid}/{r}", argv, n.dir / f"producer-{wid}-{r}.log",
                                                   pipes=True))
        n.producers[(wid, r)] = p
        if wait:
            p.proc.ask(None, 60.0)
        return p

    def start_router(self, rt: Router) -> None:
        rt.start()
        for n in self.nodes:
            for (wid, r) in n.producers:
                w = wid - 100 * n.index
                pub, replay = self.ports(w, r)
                rt.register(wid, r, f"tcp://{n.ip}:{pub}", f"tcp://{n.ip}:{replay}", BLOCK_SIZE)

    def faulted(self) -> list[Router]:
        """Router 1 of each kind: the ones the faults hit (the others are judged beside them)."""
        return [rt for rt in self.routers if rt.index == 1]

    def producers(self) -> list[Producer]:
        return [p for n in self.nodes for p in n.producers.values()]

    def stop(self) -> None:
        for rt in self.routers:
            rt.kill()
        for n in self.nodes:
            for p in n.producers.values():
                p.proc.kill()
            if n.kvshmd is not None:
                n.kvshmd.kill()

    # --- load and judging ----------------------------------------------------------------------------------

    def run(self, hz: float | None = None) -> None:
        for p in self.producers():
            p.proc.ask({"op": "run", "hz": hz or self.cfg.hz}, 30.0)

    def rebase(self) -> None:
        """Every producer publishes an AllBlocksCleared: a router that receives live state is exact again whatever
        a previous fault left it (so each fault is judged from a clean start)."""
        for p in self.producers():
            p.proc.ask({"op": "clear"}, 30.0)

    def idle(self) -> None:
        """Stops the steps; the truth is each producer's cache from now until the next :meth:`run`."""
        for n in self.nodes:
            for key, p in n.producers.items():
                self.truth[key] = frozenset(p.proc.ask({"op": "idle"}, 60.0)["truth"])

    def judge(self, since: float, routers: list[Router] | None = None) -> list[Verdict]:
        """Polls every router's /dump in turn until each matches the truth, or ``converge_s`` after ``since``;
        a router's time is when its first matching dump was asked for."""
        left = list(routers or self.routers)
        done: dict[int, Verdict] = {}
        last: dict[int, tuple[int, int, str]] = {rt.ns_index: (-1, -1, "") for rt in left}
        while left:
            for rt in list(left):
                asked = time.monotonic()
                state, _, _ = rt.state()
                if state is None:
                    last[rt.ns_index] = (-1, -1, "/dump failed")
                    continue
                extra, missing = extra_missing_keyed(state, self.truth)
                last[rt.ns_index] = (extra, missing, "")
                if extra == 0 and missing == 0:
                    done[rt.ns_index] = Verdict(rt.index, 0, 0, True, max(0.0, asked - since), kind=rt.kind)
                    left.remove(rt)
            if left and time.monotonic() - since >= self.cfg.converge_s:
                for rt in left:
                    e, m, note = last[rt.ns_index]
                    done[rt.ns_index] = Verdict(rt.index, e, m, False, None, note, rt.kind)
                break
            if left:
                time.sleep(0.2)
        return [done[i] for i in sorted(done)]

    def kvshmd_cpu(self) -> float:
        return sum(cpu_seconds(n.kvshmd.pid) for n in self.nodes if n.kvshmd is not None)

    def producers_cpu(self) -> float:
        return sum(cpu_seconds(p.proc.pid) for p in self.producers())

    def truth_blocks(self) -> int:
        return sum(len(t) for t in self.truth.values())

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"publisher": c.publisher, "nodes": c.nodes, "workers": c.workers, "ranks": c.ranks,
                "routers": c.routers, "kinds": list(c.kinds), "buffer_steps": c.buffer_steps, "hz": c.hz,
                "seed": c.seed}
