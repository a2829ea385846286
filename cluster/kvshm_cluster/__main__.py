"""``python -m kvshm_cluster``: the fault table for each publisher (and, with ``--scale``, the restart figures)."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from kvshm_testkit import kill_live, markdown_table

from . import faults, net
from .cluster import Cluster, Config
from .faults import must_converge
from .router import KINDS


def _term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def cleanup(n: net.Net | None) -> None:
    kill_live()
    if n is not None:
        n.down()


def run_faults(cfg: Config, only: list[str]) -> list[faults.Row]:
    n = net.Net()
    rows: list[faults.Row] = []
    try:
        n.up(cfg.nodes, cfg.routers * len(cfg.kinds))
        c = Cluster(cfg, n)
        print(f"cluster {cfg.publisher}: {cfg.nodes} nodes x {cfg.workers} workers x {cfg.ranks} ranks, "
              f"{cfg.routers} routers of each kind ({', '.join(cfg.kinds)}), "
              f"replay window {cfg.buffer_steps} batches at {cfg.hz:g} batches/s",
              flush=True)
        c.start()
        c.run()
        for name, fn in faults.FAULTS:
            if only and name not in only:
                continue
            rows += fn(c)
        c.stop()
    finally:
        cleanup(n)
    return rows


def table(rows: list[faults.Row]) -> str:
    """One line per (fault, router), the publishers side by side: extra / missing blocks, converged in s or NO.
    Routers are named by kind and index ("dynamo 1", "llmd 1") when more than one kind ran, else by index."""
    pubs = sorted({r.publisher for r in rows}, key=lambda p: (p != "kvshm", p))
    order = [f for f, _ in faults.FAULTS]
    named = len({r.kind for r in rows}) > 1
    cells: dict[tuple[str, str, int], dict[str, str]] = {}
    for r in rows:
        if r.note == "n/a":
            cell = "n/a"
        else:
            conv = f"yes, {r.seconds:.1f} s" if r.converged and r.seconds is not None else "NO"
            cell = f"{r.extra} / {r.missing}, {conv}"
        cells.setdefault((r.fault, r.kind, r.router), {})[r.publisher] = cell

    def sort_key(k: tuple[str, str, int]) -> tuple[int, int, str, int]:
        f = _key(k[0])
        return (order.index(f) if f in order else 99, ROUTER_ORDER.get(k[1], 9), k[1], k[2])

    return markdown_table(["fault", "router", *(f"{p}: extra / missing, converged" for p in pubs)],
                          [[f, f"{kind} {rt}" if named else str(rt), *(cells[(f, kind, rt)].get(p, "") for p in pubs)]
                           for f, kind, rt in sorted(cells, key=sort_key)])


ROUTER_ORDER = {"dynamo": 0, "llmd": 1}


def _key(fault: str) -> str:
    names = {"router restart (in window)": "router-restart-early", "steady": "steady",
             "partition > window": "partition", "router restart (late)": "router-restart-late",
             "slow router (SIGSTOP)": "slow-router", "kvshmd SIGKILL+restart": "kvshmd-restart",
             "engine SIGKILL+restart": "engine-restart"}
    return names.get(fault, fault)


def render(results: dict[str, Any]) -> int:
    from . import scale

    if results.get("faults", {}).get("rows"):
        print(f"seed {results['seed']}; {results['faults']['shape']}")
        print(table([faults.Row(**r) for r in results["faults"]["rows"]]))
    if "scale" in results:
        print(scale.table(results["scale"]))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="kvshm_cluster")
    ap.add_argument("--kvshmd", type=Path)
    ap.add_argument("--router", type=Path, help="the conformance crate's standalone binary")
    ap.add_argument("--llmd", type=Path, help="llm-d's consumer (build/llmd-router, cluster/llmd)")
    ap.add_argument("--routers", default=None,
                    help="router kinds, comma-separated: dynamo, llmd (default: both when --llmd names a binary)")
    ap.add_argument("--render", type=Path, help="print the tables of a results.json and exit")
    ap.add_argument("--out", type=Path, default=Path("build/cluster"))
    ap.add_argument("--short", action="store_true", help="the small fast form (< 3 min)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--publishers", default="kvshm,vllm")
    ap.add_argument("--faults", default="", help="none, or a comma-separated subset of " +
                    ",".join(f for f, _ in faults.FAULTS))
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a kvshm row did not converge that kvshm can make exact (faults.must_converge)")
    ap.add_argument("--scale", default="", help="node counts for the restart figures, e.g. 8,32,64")
    ap.add_argument("--scale-blocks", type=int, default=100_000)
    a = ap.parse_args()
    if a.render:
        return render(json.loads(a.render.read_text()))
    if a.kvshmd is None or a.router is None:
        ap.error("--kvshmd and --router are required")
    llmd = a.llmd.resolve() if a.llmd is not None and a.llmd.is_file() else None
    kinds = tuple(k for k in (a.routers or ("dynamo,llmd" if llmd else "dynamo")).split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        ap.error(f"--routers: kinds are {', '.join(KINDS)}")
    if "llmd" in kinds and llmd is None:
        ap.error("--routers llmd needs --llmd naming the built llmd-router")
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGHUP, _term)
    gone = net.clean_stale()
    if gone:
        print(f"removed what a crashed run left: {' '.join(gone)}")
    seed = a.seed if a.seed is not None else int(time.time()) % 100_000
    a.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"seed": seed, "short": a.short, "routers": list(kinds)}
    if a.short:
        shape = dict(nodes=2, workers=1, ranks=2, routers=2, buffer_steps=60, hz=30.0, capacity=500)
    else:
        shape = dict(nodes=4, workers=2, ranks=2, routers=2, buffer_steps=300, hz=25.0, capacity=2000)
    rows: list[faults.Row] = []
    only = [f for f in a.faults.split(",") if f]
    for pub in a.publishers.split(",") if a.faults != "none" else []:
        shutil.rmtree(a.out / pub, ignore_errors=True)
        cfg = Config(publisher=pub, seed=seed, kvshmd=a.kvshmd.resolve(), router_bin=a.router.resolve(),
                     out=(a.out / pub).resolve(), converge_s=10.0 if a.short else 20.0, kinds=kinds, llmd_bin=llmd,
                     **shape)  # type: ignore[arg-type]
        rows += run_faults(cfg, only)
    results["faults"] = {"shape": shape, "rows": [asdict(r) for r in rows]}
    if a.scale:
        from . import scale

        results["scale"] = scale.run([int(x) for x in a.scale.split(",")], a.scale_blocks, a, seed)
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    print()
    print(f"seed {seed}; {shape}")
    if rows:
        print(table(rows))
    if "scale" in results:
        print(scale.table(results["scale"]))
    print(f"kvshm_cluster: {time.monotonic() - started:.0f} s; figures in {a.out / 'results.json'}")
    missed = sorted({f"{r.fault} ({r.kind} router {r.router})" for r in rows if must_converge(r) and not r.converged})
    if missed:
        print(f"kvshm did not converge after: {', '.join(missed)}")
    beyond = sorted({f"{r.fault} ({r.kind} router {r.router})" for r in rows
                     if r.publisher == "kvshm" and r.note != "n/a" and not r.converged and not must_converge(r)})
    if beyond:
        print(f"not converged where the router's protocol cannot recover a missed window: {', '.join(beyond)}")
    return 1 if a.strict and missed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        cleanup(None)
