"""The restart figures: N nodes x one worker x B blocks, one router SIGKILLed and restarted, the time until it holds
every worker's whole cache again, per publisher; bytes into the router's namespace, kvshmd CPU meanwhile; and the
same state fetched from every node's kvshmd ``/kv_recover`` (Dynamo's JSON) for comparison.

Full state is probed with the router's own ``POST /query``: the tokens of each worker's last prefilled segment score
all their blocks only once the batch carrying them is applied, and a replay applies in order. The prefill is
published in large batches (64 segments of 16 blocks), so the replay window (10,000 batches, vLLM's default)
holds it whole for both publishers: this measures recovery speed, not the window.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from kvshm_testkit import Timeout, cpu_seconds, http_get, http_post, kill_live, markdown_table, wait_until

from . import net
from .cluster import KVSHMD_HTTP_PORT, REF_HTTP_PORT, Cluster, Config
from .gen import BLOCK_SIZE
from .router import MODEL, Router

TIMEOUT = 300.0
IDLE_S = 5.0
ROUNDS = 3  # router restarts per size and publisher; the median is the row


def _full(rt: Router, probes: dict[int, list[int]]) -> bool:
    """Whether the router scores every worker's last segment whole."""
    # One query per worker: the segments differ, and a worker's score is its own.
    for w, tokens in probes.items():
        r = http_post(rt.url + "/query", json.dumps({"token_ids": tokens, "model_name": MODEL}).encode(), 10.0)
        if r.status != 200:
            return False
        got = r.json().get("scores", {}).get(str(w), {}).get("0", 0)
        if got < len(tokens):
            return False
    return True


def have_ref() -> bool:
    """Whether Dynamo's LocalKvIndexer (the conformance crate's Python module) is importable for the producers."""
    import importlib.util

    return importlib.util.find_spec("kvshm_conformance") is not None


def _fetch_all(urls: list[str]) -> tuple[float, int]:
    """GETs every URL in turn, parsing each answer: (seconds, bytes)."""
    t0 = time.monotonic()
    got = 0
    for url in urls:
        r = http_get(url, 120.0)
        if r.status != 200:
            raise Timeout(f"{url}: HTTP {r.status} {r.error}")
        got += len(r.body)
        r.json()
    return round(time.monotonic() - t0, 2), got


def one(nodes: int, blocks: int, publisher: str, a: argparse.Namespace, seed: int) -> dict[str, Any]:
    n = net.Net()
    out: dict[str, Any] = {"nodes": nodes, "blocks_per_worker": blocks, "publisher": publisher}
    try:
        n.up(nodes, 1)
        cfg = Config(publisher=publisher, nodes=nodes, workers=1, ranks=1, routers=1, buffer_steps=10_000, hz=1.0,
                     capacity=blocks, seed=seed, kvshmd=a.kvshmd.resolve(), router_bin=a.router.resolve(),
                     out=(a.out / f"scale-{publisher}-{nodes}").resolve(),
                     ref_http=publisher == "vllm" and have_ref())
        c = Cluster(cfg, n)
        c.start()
        t0 = time.monotonic()
        probes: dict[int, list[int]] = {}
        for p in c.producers():
            probes[p.worker] = p.proc.ask({"op": "prefill", "blocks": blocks}, TIMEOUT)["last_tokens"]
        out["prefill_s"] = round(time.monotonic() - t0, 2)
        for p in c.producers():
            p.proc.ask({"op": "idle"}, TIMEOUT)  # probes every 0.5 s: a restarted router sees each stream
        rt = c.routers[0]
        wait_until("first router holds every cache", lambda: _full(rt, probes), TIMEOUT, 0.5)
        rns = n.router_ns(1)
        # kvshmd's CPU while nothing but probes flows (heartbeats, probes, checkpoints): the storm's baseline.
        cpu0, t0 = c.kvshmd_cpu(), time.monotonic()
        time.sleep(IDLE_S)
        if publisher == "kvshm":
            out["kvshmd_idle_cpu_per_s"] = round((c.kvshmd_cpu() - cpu0) / (time.monotonic() - t0), 3)
        runs: list[dict[str, Any]] = []
        for _ in range(ROUNDS):
            (rx0, pk0), cpu0 = n.rx(rns), c.kvshmd_cpu()
            t0 = time.monotonic()
            rt.kill()
            c.start_router(rt)
            wait_until("restarted router holds every cache", lambda: _full(rt, probes), TIMEOUT, 0.1)
            run = {"restart_s": round(time.monotonic() - t0, 2)}
            assert rt.proc is not None
            run["router_cpu_s"] = round(cpu_seconds(rt.proc.pid), 2)
            rx1, pk1 = n.rx(rns)
            run["wire_bytes"], run["wire_packets"] = rx1 - rx0, pk1 - pk0
            if publisher == "kvshm":
                run["kvshmd_cpu_s"] = round(c.kvshmd_cpu() - cpu0, 2)
            runs.append(run)
        out["rounds"] = runs
        # The median round (by restart time) is the row; every round is kept.
        out.update(sorted(runs, key=lambda r: r["restart_s"])[len(runs) // 2])
        out.setdefault("kvshmd_cpu_s", None)
        if nodes * blocks <= 1_000_000:
            state, size, _ = rt.state(120.0)
            c.idle()
            out["exact"] = state is not None and all(state.get(k, set()) == t for k, t in c.truth.items())
        # The same state as one /kv_recover answer per worker (Dynamo's JSON), fetched in turn: from each node's
        # kvshmd, or (vLLM) from each engine's own LocalKvIndexer; the serving side's CPU meanwhile.
        urls = [f"http://{node.ip}:{KVSHMD_HTTP_PORT}/workers/{p.worker}/kv_recover?start=0" if publisher == "kvshm"
                else f"http://{node.ip}:{REF_HTTP_PORT}/kv_recover?start=0"
                for node in c.nodes for p in node.producers.values()]
        if publisher == "kvshm" or cfg.ref_http:
            cpu0 = c.kvshmd_cpu() if publisher == "kvshm" else c.producers_cpu()
            out["kv_recover_s"], out["kv_recover_bytes"] = _fetch_all(urls)
            cpu1 = c.kvshmd_cpu() if publisher == "kvshm" else c.producers_cpu()
            out["kv_recover_server_cpu_s"] = round(cpu1 - cpu0, 2)
        c.stop()
    except Timeout as e:
        out["error"] = str(e)
    finally:
        kill_live()
        n.down()
    print(f"  scale {publisher:<6} {nodes:>3} nodes x {blocks} blocks: {out}", flush=True)
    return out


def run(sizes: list[int], blocks: int, a: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for nodes in sizes:
        for pub in a.publishers.split(","):
            rows.append(one(nodes, blocks, pub, a, seed))
    return rows


def _restart(r: dict[str, Any]) -> str:
    if "restart_s" not in r:
        return str(r.get("error", "-"))
    every = ", ".join(str(x["restart_s"]) for x in r.get("rounds", []))
    return f"{r['restart_s']} ({every})" if every else str(r["restart_s"])


def _cpu(r: dict[str, Any]) -> str:
    if r.get("kvshmd_cpu_s") is None:
        return ""
    return f"{r['kvshmd_cpu_s']}; {r.get('kvshmd_idle_cpu_per_s', '')}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ["nodes", "blocks/worker", "publisher", "router restart to full state (s; median of 3, all)",
            "bytes into the router", "kvshmd CPU (s; idle CPU/s)", "router CPU (s)",
            "/kv_recover of every worker (s, bytes, server CPU s)"]
    lines = []
    for r in rows:
        kv = (f"{r['kv_recover_s']}, {r['kv_recover_bytes']:,}, {r.get('kv_recover_server_cpu_s', '')}"
              if "kv_recover_s" in r else "")
        lines.append([str(r["nodes"]), f"{r['blocks_per_worker']:,}", r["publisher"], _restart(r),
                      f"{r.get('wire_bytes', 0):,}", _cpu(r), str(r.get("router_cpu_s", "")), kv])
    return markdown_table(head, lines) + f"\n(block size {BLOCK_SIZE} tokens)"
