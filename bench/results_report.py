"""Writes bench/RESULTS.md and its PNG plots from one `make bench` run (never edit RESULTS.md by hand).

    .venv/bin/python bench/results_report.py --results build/bench/results.json --go build/bench/go.txt \
        --extra build/bench/publish_bench.txt --out bench/RESULTS.md

Inputs: recovery_bench.py's JSON, the Go benchmarks' output (`go test -bench` text) and other benchmark scripts'
text. Every recovery goal is printed with its same-run baseline and ratio, and PASS or MISS; nothing fails.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_report  # noqa: E402
from _report import Goal, mb, ratio_s, table, us, verdict  # noqa: E402

GOAL_ROWS_DOC = "the recovery goals and the deployment that matters (bench/doc.go)"

# Node sizing assumptions (8 GPUs x 8 dp ranks); stated in the report next to the figures they produce.
NODE_STREAMS = 64
NODE_EVENTS_PER_RANK = 400.0  # 200 Stored (32 blocks x 32 tokens) + 200 Removed per second per rank
NODE_BLOCKS_PER_RANK = 100_000
DEFAULT_RING_BYTES = 64 << 20

# The publisher's goals: kvshm publishing costs the engine at most 0.4x its own publisher + the reference indexer, and a
# subscriber sees a batch within 1 ms (p99) at 1,000 batches/s.
ZMQ_COST_LIMIT = 0.4
ZMQ_LATENCY_P99_US = 1000.0
ZMQ_WORKLOADS = {"headline": "32×32 Stored", "mix": "mix of 1–4 events"}
ZMQ_SIDES = {"a": "(a) msgspec + pyzmq + reference indexer", "b": "(b) msgspec + pyzmq + kvshm `apply_*`",
             "c": "(c) kvshm `apply_batch`, kvshmd publishes"}


@dataclass
class GoBench:
    name: str
    iterations: int
    metrics: dict[str, float]


GO_LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def parse_go(text: str) -> list[GoBench]:
    """The result lines of `go test -bench` output: name (GOMAXPROCS suffix dropped), iterations, value/unit pairs."""
    out = []
    for line in text.splitlines():
        m = GO_LINE.match(line.strip())
        if not m:
            continue
        fields = m.group(3).split()
        metrics: dict[str, float] = {}
        for value, unit in zip(fields[0::2], fields[1::2]):
            try:
                metrics[unit] = float(value)
            except ValueError:
                break
        if metrics:
            out.append(GoBench(m.group(1), int(m.group(2)), metrics))
    return out


def wake_floors(gos: list[GoBench]) -> dict[float, float]:
    """BenchmarkWakeFloor's consumer CPU per wakeup (µs) by rate (batches/s)."""
    out = {}
    for b in gos:
        m = re.fullmatch(r"BenchmarkWakeFloor/rate=(\d+)", b.name)
        if m and "consumer_us/wake" in b.metrics:
            out[float(m.group(1))] = b.metrics["consumer_us/wake"]
    return out


def goals(d: dict[str, Any]) -> list[Goal]:
    gs: list[Goal] = []
    q = d.get("queries", {}).get("summary", {})
    p = d.get("publish", {}).get("summary", {})
    dep = d.get("deployment", {}).get("sides", {})
    has_ref = "events10/ref" in q

    def cmp(name: str, target: str, a: dict[str, float] | None, b: dict[str, float] | None, limit: float,
            bname: str = "reference") -> None:
        if not a:
            return
        if not b:
            gs.append(Goal(name, target, us(a["median_us"]), f"{bname}: skipped", None, None))
            return
        r = a["median_us"] / b["median_us"]
        gs.append(Goal(name, target, f"{us(a['median_us'])} (p99 {us(a['p99_us'])})",
                       f"{bname} {us(b['median_us'])} (p99 {us(b['p99_us'])})", r, r <= limit))

    cmp("`get_events_json`, 10 recent events", "≤ 1.5× reference", q.get("events10/kvshm"),
        q.get("events10/ref"), 1.5)
    for case, label in (("toonew", "TooNew"), ("invalid", "InvalidRange")):
        a = q.get(f"{case}/kvshm")
        if a:
            b = q.get(f"{case}/ref")
            gs.append(Goal(f"`get_events_json` → {label}", "≤ 50 µs median",
                           f"{us(a['median_us'])} (p99 {us(a['p99_us'])})",
                           f"reference {us(b['median_us'])}" if b else "reference: skipped",
                           a["median_us"] / b["median_us"] if b else None, a["median_us"] <= 50))
    blocks = d.get("queries", {}).get("blocks", 0)
    cmp(f"TreeDump, {blocks:,} blocks, fresh", "≤ 1.0× reference", q.get("dump_fresh/kvshm"),
        q.get("dump_fresh/ref"), 1.0)
    cmp(f"TreeDump, {blocks:,} blocks, cached", "≤ 0.5× reference", q.get("dump_cached/kvshm"),
        q.get("dump_cached/ref"), 0.5)
    cmp("`apply_stored` 32×32 lists (daemon ingesting)", "≤ 1.3× floor", p.get("stored/32/kvshm"),
        p.get("stored/32/floor"), 1.3, "floor")
    cmp("`apply_removed` 32 hashes", "≤ 1.0× reference", p.get("removed/32/kvshm"), p.get("removed/32/ref"), 1.0)
    if dep.get("kvshm"):
        for kind in ("Events", "TreeDump"):
            a = dep["kvshm"].get(f"http_{kind}")
            b = dep.get("ref", {}).get(f"http_{kind}")
            cmp(f"deployment: {kind} reply over HTTP, while the engine publishes", "≤ 0.5× engine-served", a, b,
                0.5, "engine-served")
        def change(side: dict[str, Any]) -> tuple[float, str]:
            a, b = side["quiet"], side["traffic"]
            qa, ta = a["apply_stored"], b["apply_stored"]
            text = (f"p50 {us(qa['median_us'])} → {us(ta['median_us'])} "
                    f"({100 * (ta['median_us'] / qa['median_us'] - 1):+.0f}%), mean "
                    f"{100 * (ta['mean_us'] / qa['mean_us'] - 1):+.0f}%, p99 {us(qa['p99_us'])} → {us(ta['p99_us'])}; "
                    f"engine CPU {a['engine_cpu_pct']:.1f}% → {b['engine_cpu_pct']:.1f}%")
            return ta["median_us"] / qa["median_us"], text

        r_kv, t_kv = change(dep["kvshm"])
        base = "engine-served: skipped"
        if dep.get("ref"):
            base = "engine-served: " + change(dep["ref"])[1]
        gs.append(Goal("deployment: engine's `apply_stored` cost under recovery traffic (median)", "≤ +10%",
                       t_kv, base, r_kv, r_kv <= 1.10))
    # information rows: same-run ratios without a goal
    for key, label in (("stored/32", "`apply_stored` 32×32 vs reference (no goal)"),
                       ("cleared", "`apply_cleared` vs reference (no goal)")):
        a, b = p.get(f"{key}/kvshm"), p.get(f"{key}/ref")
        if a and b:
            r = a["median_us"] / b["median_us"]
            gs.append(Goal(label, "—", us(a["median_us"]), f"reference {us(b['median_us'])}", r, None, "info"))
    info = d.get("queries", {}).get("info", {})
    if info.get("kvshm") and info.get("ref"):
        a, b = info["kvshm"]["dump_fresh"], info["ref"]["dump_fresh"]
        gs.append(Goal(f"TreeDump bytes, {blocks:,} blocks (no goal)", "—", f"{mb(a['bytes'])} ({a['events']} events)",
                       f"reference {mb(b['bytes'])} ({b['events']} events)", a["bytes"] / b["bytes"], None, "info"))
    del has_ref
    return gs


def zmq_goals(d: dict[str, Any]) -> list[Goal]:
    """The publisher's goal rows: (c)/(a) per batch inline and in engine CPU threaded, each ≤ ZMQ_COST_LIMIT; (c)'s
    publish-to-subscriber p99 ≤ ZMQ_LATENCY_P99_US. A side that was not measured makes its rows skipped."""
    z = d.get("zmq")
    if not z:
        return []
    gs: list[Goal] = []
    inl, th = z["inline"]["summary"], z["threaded"]
    target = f"≤ {ZMQ_COST_LIMIT}× (a)"
    for w, wl in ZMQ_WORKLOADS.items():
        a, c = inl.get(f"{w}/a"), inl.get(f"{w}/c")
        name = f"engine cost per batch, {wl}, all work inline (median)"
        if a and c:
            r = c["median_us"] / a["median_us"]
            gs.append(Goal(name, target, f"(c) {us(c['median_us'])} (p99 {us(c['p99_us'])})",
                           f"(a) {us(a['median_us'])} (p99 {us(a['p99_us'])})", r, r <= ZMQ_COST_LIMIT))
        else:
            gs.append(Goal(name, target, f"(c) {us(c['median_us'])}" if c else "(c): skipped",
                           f"(a) {us(a['median_us'])}" if a else "(a): skipped", None, None))
    for w, wl in ZMQ_WORKLOADS.items():
        ta, tc = th.get(f"{w}/a"), th.get(f"{w}/c")
        name = f"engine-process CPU per batch, {wl}, threaded as vLLM at {z['rate']:,.0f} batches/s"
        if ta and tc:
            r = tc["engine_cpu_us"] / ta["engine_cpu_us"]
            gs.append(Goal(name, target, f"(c) {us(tc['engine_cpu_us'])} ({tc['engine_cpu_pct']:.1f}% of a core)",
                           f"(a) {us(ta['engine_cpu_us'])} ({ta['engine_cpu_pct']:.1f}% of a core)", r,
                           r <= ZMQ_COST_LIMIT))
        else:
            gs.append(Goal(name, target, f"(c) {us(tc['engine_cpu_us'])}" if tc else "(c): skipped",
                           f"(a) {us(ta['engine_cpu_us'])}" if ta else "(a): skipped", None, None))
    for w, wl in ZMQ_WORKLOADS.items():
        ta, tc = th.get(f"{w}/a"), th.get(f"{w}/c")
        name = f"publish → subscriber latency p99, {wl}, {z['rate']:,.0f} batches/s"
        lim = f"p99 ≤ {us(ZMQ_LATENCY_P99_US)}"
        base = (f"(a) pyzmq publisher thread: p50 {us(ta['latency']['median_us'])}, p99 "
                f"{us(ta['latency']['p99_us'])}") if ta else "(a): skipped"
        if tc and tc["latency"]["n"]:
            lc = tc["latency"]
            gs.append(Goal(name, lim, f"(c) kvshmd: p50 {us(lc['median_us'])}, p99 {us(lc['p99_us'])}", base,
                           lc["p99_us"] / ta["latency"]["p99_us"] if ta and ta["latency"]["n"] else None,
                           lc["p99_us"] <= ZMQ_LATENCY_P99_US))
        else:
            gs.append(Goal(name, lim, "(c): skipped" if not tc else "(c): nothing received", base, None,
                           None if not tc else False))
    return gs


def zmq_threads_reading(th: dict[str, Any]) -> list[str]:
    """Where each side's engine CPU goes, per workload, in words: what stays on the scheduler thread and what moves
    off it (to vLLM's publisher thread and libzmq's I/O thread for (a), to kvshmd for (c))."""
    out = []
    for w, wl in ZMQ_WORKLOADS.items():
        a, c = th.get(f"{w}/a"), th.get(f"{w}/c")
        if not a or not c:
            continue
        more = c["scheduler_cpu_us"] > a["scheduler_cpu_us"]
        out.append(
            f"* {wl}: (a) costs the engine {us(a['engine_cpu_us'])} per batch, of which {us(a['scheduler_cpu_us'])} on "
            f"the scheduler thread, {us(a['publisher_cpu_us'])} on the publisher thread and "
            f"{us(a['other_cpu_us'])} on other threads; (c) costs {us(c['engine_cpu_us'])}, "
            f"{us(c['scheduler_cpu_us'])} of it on the scheduler thread, and kvshmd {us(c['daemon_cpu_us'] or 0)} in "
            f"its own process (with (b), which only indexes: {us(th.get(f'{w}/b', {}).get('daemon_cpu_us') or 0)}). "
            + ("The scheduler thread itself pays more with (c) than (a)'s queue hand-off: (c) trades "
               f"{us(c['scheduler_cpu_us'] - a['scheduler_cpu_us'])} more there for "
               f"{us(a['engine_cpu_us'] - c['engine_cpu_us'])} less in the engine process."
               if more else "The scheduler thread pays no more with (c) than with (a)'s queue hand-off."))
    return out


def cluster_section(c: dict[str, Any], source: str) -> list[str]:
    """The cluster's restart curve from a `make cluster` measurement (its results.json, committed under
    cluster/measured): a router's restart to full state per size, kvshm beside vLLM's publisher of the same run.
    `make cluster` measures it (namespaces, real routers: root, minutes), not `make bench`."""
    by = {(r["nodes"], r["publisher"]): r for r in c.get("scale", []) if "restart_s" in r}
    sizes = sorted({n for n, _ in by})
    if not sizes:
        return []
    L = ["## Cluster", "",
         f"From `{source}` (`make cluster`, seed {c.get('seed')}; the method: cluster/README.md; the fault "
         "table: docs/deploy.md): N nodes in network namespaces x one worker x 100 k blocks, Dynamo 1.6.1's "
         "standalone indexer SIGKILLed and restarted 3 times, the time until its own `POST /query` scores every "
         "worker's last chain whole. Goal: <= 5 s at 64 nodes.", ""]
    rows = []
    for n in sizes:
        k, v = by.get((n, "kvshm")), by.get((n, "vllm"))
        if k is None:
            continue
        rows.append([str(n), f"{k['restart_s']} s", f"{v['restart_s']} s" if v else "—",
                     ratio_s(k["restart_s"] / v["restart_s"]) if v else "—", f"{k['router_cpu_s']} / "
                     + (f"{v['router_cpu_s']}" if v else "—"), mb(k["wire_bytes"]),
                     f"{k.get('kvshmd_cpu_s')} ({k.get('kvshmd_idle_cpu_per_s')} idle)",
                     f"{k['kv_recover_s']} s / " + (f"{v['kv_recover_s']} s" if v and "kv_recover_s" in v else "—")
                     if "kv_recover_s" in k else "—",
                     verdict(k["restart_s"] <= 5.0) if n == 64 else "info"])
    return L + table(["nodes", "kvshm", "vLLM's publisher (its window holds the cache)", "ratio",
                      "router CPU s, kvshm / vLLM", "bytes into the router (kvshm)",
                      "kvshmd CPU s in the storm (CPU s/s idle)",
                      "`/kv_recover` of every worker instead: kvshmd / the engine's LocalKvIndexer", "verdict"],
                     rows) + [""]


def zmq_section(d: dict[str, Any]) -> list[str]:
    """The "kvshmd as the publisher" section of RESULTS.md."""
    z = d.get("zmq")
    if not z:
        return []
    inl, th = z["inline"], z["threaded"]
    sides = [s for s in ZMQ_SIDES if any(k.endswith(f"/{s}") for k in th)]
    L = ["## kvshmd as the publisher", "",
         "What an engine pays per KV-event batch, three ways, in the same run on the same seeded vLLM-shaped batches "
         "(bench/_vllm.py: the Structs of vLLM 0.33.0's kv_events.py; "
         + ", ".join(f"{wl}: median payload {inl['payload_bytes'].get(w, 0):,} B" for w, wl in ZMQ_WORKLOADS.items())
         + "; the mix has an AllBlocksCleared about once in 400 batches):", ""]
    L += [f"* **{label}**" + {
        "a": ": the engine builds `KVEventBatch(ts, events)`; a vLLM-style publisher encodes it with msgspec, sends "
             "`[topic, seq, payload]` on a pyzmq PUB and keeps it for replay; each event goes to the reference "
             "in-process LocalKvIndexer (Dynamo 1.6.1, the old extension's `apply_stored`/...).",
        "b": ": the same publisher, kvshm's `LocalIndexer.apply_stored`/... as the indexer.",
        "c": ": `LocalIndexer(..., publish=kvshm.ZmqPublish(...)).apply_batch(seq, events, ts)`; kvshmd encodes "
             "and publishes."}[s] for s, label in ZMQ_SIDES.items()]
    L += ["", "The indexers of (a) and (b) take one id per event (the old API); the ZMQ seq counts batches. Every "
          "side's endpoint has one pyzmq SUB connected (another process).", ""]
    for line in z.get("skipped", []):
        L += [f"* SKIPPED: {line}"]
    if z.get("skipped"):
        L += [""]
    rows = [[g.name, g.target, g.kvshm, g.baseline, ratio_s(g.ratio), verdict(g.ok)] for g in zmq_goals(d)]
    L += ["### Goals", "", *table(["goal", "target", "kvshm", "baseline (same run)", "ratio", "verdict"], rows), ""]
    L += ["### Per batch, all work inline", "",
          f"Every call timed with all of its work on the timing thread (batch object, encode, send, indexer apply); "
          f"{z['rounds']} rounds × {z['n']} batches per workload and side, sides rotated every round. For (a)/(b) "
          "the two parts are timed too: encode + send is what vLLM's publisher thread does, the indexer apply what "
          "the old extension costs its caller (the reference applies to its radix tree on a thread of its own, and "
          "libzmq sends from its I/O thread: work these timings do not include and the threaded CPU below does).",
          ""]
    rows = []
    sm = inl["summary"]
    for w, wl in ZMQ_WORKLOADS.items():
        a = sm.get(f"{w}/a")
        for s in sides:
            k = sm.get(f"{w}/{s}")
            if not k:
                continue
            send, apply = sm.get(f"{w}/{s}/send"), sm.get(f"{w}/{s}/apply")
            rows.append([wl, ZMQ_SIDES[s], us(k["median_us"]), us(k["p99_us"]), us(k["mean_us"]),
                         us(send["median_us"]) if send else "—", us(apply["median_us"]) if apply else "—",
                         ratio_s(k["median_us"] / a["median_us"]) if a else "—"])
    L += table(["workload", "side", "p50", "p99", "mean", "encode + send p50", "indexer apply p50", "p50 / (a)"],
               rows)
    drops = ", ".join(f"({k}) {v:,}" for k, v in inl.get("dropped", {}).items() if k != "a")
    L += ["", f"Dropped by kvshm in this phase (ring full, or kvshmd's ZMQ queue): {drops or 'not measured'}.", ""]
    L += ["### Threaded as vLLM runs it: engine-process CPU and where it is spent", "",
          f"Each side in its own engine process, {z['threaded_rounds']} rounds × {z['seconds']:g} s per workload at "
          f"{z['rate']:,.0f} batches/s, sides rotated. The scheduler (main) thread builds each batch and calls "
          "`publish`: for (a)/(b) a queue put, a publisher thread then encodes, sends and applies the indexer (vLLM's "
          "ZmqEventPublisher thread; a fork calling the old indexer on the scheduler thread moves the inline "
          "\"indexer apply\" column there); for (c) `publish` is `apply_batch` on the scheduler thread and there is no "
          "publisher thread. CPU per batch is the engine process's user+system time (all threads: libzmq's I/O "
          "thread, the reference's radix-tree thread and tokio workers, kvshm's supervisor thread are in \"other\") "
          "minus an idle engine running the same loop (pacing, the batch objects) without publishing; "
          "thread figures from pthread CPU clocks. kvshmd's CPU is its own process, off the engine.", ""]
    rows = []
    for w, wl in ZMQ_WORKLOADS.items():
        base = th.get(f"{w}/a")
        for s in sides:
            t = th.get(f"{w}/{s}")
            if not t:
                continue
            pc = t["publish_call"]
            rows.append([wl, ZMQ_SIDES[s], f"{t['rate']:,.0f}/s", us(t["engine_cpu_us"]),
                         ratio_s(t["engine_cpu_us"] / base["engine_cpu_us"]) if base else "—",
                         f"{t['engine_cpu_pct']:.1f}%", us(t["scheduler_cpu_us"]),
                         us(t["publisher_cpu_us"]) if s != "c" else "—", us(t["other_cpu_us"]),
                         f"{us(pc['median_us'])} / {us(pc['p99_us'])}",
                         us(t["daemon_cpu_us"]) if t.get("daemon_cpu_us") is not None else "—", str(t["dropped"])])
        idle = th.get(f"{w}/idle")
        if idle:
            rows.append([wl, "idle engine (pacing and batch objects, subtracted above)", f"{idle['rate']:,.0f}/s",
                         f"{us(idle['raw_engine_cpu_us'])} raw", "—", "—", "—", "—", "—", "—", "—", "—"])
    L += table(["workload", "side", "rate", "engine CPU / batch", "vs (a)", "engine CPU",
                "scheduler thread CPU / batch", "publisher thread CPU / batch", "other threads CPU / batch",
                "scheduler `publish` call p50 / p99", "kvshmd CPU / batch", "dropped"], rows)
    L += ["", *zmq_threads_reading(th), "", "### Publish → subscriber latency", "",
          f"During the threaded runs ({z['rate']:,.0f} batches/s, paced) a pyzmq SUB in another process stamps each "
          "message with time.time() on arrival and subtracts the batch's ts from its payload (the engine's "
          "time.time() when it built the batch; one clock for every process of the machine), so (a)/(b) include the "
          "queue hand-off to the publisher thread and (c) the ring and kvshmd's drain, encode and send; the drain's "
          "wake-up after an idle gap is timed alone by BenchmarkDaemonReachLatency in the Go table below.", ""]
    rows = []
    for w, wl in ZMQ_WORKLOADS.items():
        for s in sides:
            t = th.get(f"{w}/{s}")
            if not t:
                continue
            lat = t["latency"]
            pb = t.get("payload_bytes_mean")
            rows.append([wl, "kvshmd" if s == "c" else "pyzmq publisher thread (" + s + ")", us(lat["median_us"]),
                         us(lat["p99_us"]), f"{t['received']:,} / {t['batches']:,}",
                         "—" if pb is None else f"{pb:,.0f} B"])
    L += table(["workload", "publisher", "p50", "p99", "received / published", "mean payload received"], rows)
    L += ["", f"This section took {z['elapsed_s']:.0f} s of `make bench` (inline {z['inline_s']:.0f} s).", ""]
    return L


def plots(d: dict[str, Any], outdir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    colors = {"kvshm": "tab:blue", "kvshm_http": "tab:green", "ref": "tab:orange", "floor": "tab:gray"}

    def cdf(ax: Any, samples: list[float], label: str, color: str) -> None:
        if samples:
            ys = [(i + 1) / len(samples) for i in range(len(samples))]
            ax.step([s / 1e3 for s in samples], ys, where="post", label=label, color=color)

    q = d.get("queries")
    dep = d.get("deployment")
    if q:
        cases = [("events10", "get_events_json, 10 recent events"), ("toonew", "TooNew"),
                 ("invalid", "InvalidRange"), ("dump_fresh", f"TreeDump {q['blocks']:,} blocks, fresh"),
                 ("dump_cached", f"TreeDump {q['blocks']:,} blocks, cached")]
        extra = []
        if dep:
            extra = [("Events", "HTTP /kv_recover Events (deployment)"), ("TreeDump", "HTTP /kv_recover TreeDump")]
        n = len(cases) + len(extra)
        cols = 4
        fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(16, 4 * math.ceil(n / cols)))
        flat = list(axes.flat)
        for ax, (case, title) in zip(flat, cases):
            for side, label in (("kvshm", "kvshm"), ("ref", "reference (in-process)")):
                cdf(ax, q["cdf"].get(f"{case}/{side}", []), label, colors[side])
            ax.set_title(title, fontsize=9)
        for ax, (kind, title) in zip(flat[len(cases):], extra):
            assert dep is not None
            for side, label in (("kvshm", "kvshmd --http"), ("ref", "engine-served (ThreadingHTTPServer)")):
                cdf(ax, dep["sides"].get(side, {}).get(f"cdf_{kind}", []), label, colors[side])
            ax.set_title(title, fontsize=9)
        for ax in flat[:n]:
            ax.set_xscale("log")
            ax.set_xlabel("latency (µs)")
            ax.set_ylabel("fraction ≤ x")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        for ax in flat[n:]:
            ax.axis("off")
        fig.suptitle("Query latency CDFs: kvshm vs Dynamo 1.6.1 LocalKvIndexer (same run, interleaved)")
        fig.tight_layout()
        fig.savefig(outdir / "query_latency_cdf.png", dpi=90)
        plt.close(fig)
        made.append("query_latency_cdf.png")
    p = d.get("publish")
    if p:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, kind in zip(axes, ("stored", "removed")):
            for side in ("kvshm", "ref", "floor"):
                xs = [b for b in p["sizes"] if f"{kind}/{b}/{side}" in p["summary"]]
                if not xs:
                    continue
                med = [p["summary"][f"{kind}/{b}/{side}"]["median_us"] for b in xs]
                p99 = [p["summary"][f"{kind}/{b}/{side}"]["p99_us"] for b in xs]
                label = {"kvshm": "kvshm LocalIndexer", "ref": "reference", "floor": "floor"}[side]
                ax.plot(xs, med, "o-", color=colors[side], label=f"{label} median")
                ax.plot(xs, p99, ":", color=colors[side], alpha=0.6, label=f"{label} p99")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("blocks per event (32 tokens each)")
            ax.set_ylabel("µs per call")
            ax.set_title(f"apply_{kind} cost vs event size")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(outdir / "publish_cost.png", dpi=90)
        plt.close(fig)
        made.append("publish_cost.png")
    s = d.get("scale")
    if s and s["points"]:
        pts = s["points"]
        xs = [pt["blocks"] for pt in pts]
        fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
        ax = axes[0]
        for side in ("kvshm", "kvshm_http", "ref"):
            for kind, style in (("fresh", "o-"), ("cached", "s--")):
                key = f"{kind}/{side}"
                ys = [pt["dump"][key]["median_us"] / 1e3 for pt in pts if key in pt["dump"]]
                if ys:
                    ax.plot(xs[: len(ys)], ys, style, color=colors[side], label=f"{side} {kind}")
        ax.set_title("TreeDump latency vs resident blocks")
        ax.set_ylabel("ms (median)")
        ax = axes[1]
        for side in ("kvshm", "ref"):
            ys = [pt.get(f"bytes_per_block_{side}") for pt in pts]
            if all(y is not None for y in ys):
                ax.plot(xs, ys, "o-", color=colors[side],
                        label="kvshmd RssAnon" if side == "kvshm" else "reference process RssAnon")
        ax.set_title("memory per resident block")
        ax.set_ylabel("bytes / block")
        ax = axes[2]
        ax.plot(xs, [pt["ingest_blocks_per_s"] / 1e6 for pt in pts], "o-", color=colors["kvshm"],
                label="kvshmd ingest (median of 3 bursts)")
        ax.set_title("kvshmd ingest rate vs resident blocks")
        ax.set_ylabel("M blocks/s")
        for ax in axes:
            ax.set_xscale("log")
            ax.set_xlabel("resident blocks")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        axes[0].set_yscale("log")
        fig.tight_layout()
        fig.savefig(outdir / "scale_blocks.png", dpi=90)
        plt.close(fig)
        made.append("scale_blocks.png")
    w = d.get("workers")
    if w and w["points"]:
        pts = [pt for pt in w["points"] if pt.get("rate", w["rate"]) == w["rate"]]
        xs = [pt["workers"] for pt in pts]
        fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
        axes[0].plot(xs, [pt["events_per_s_per_worker"] for pt in pts], "o-", label="published per worker")
        axes[0].plot(xs, [pt["applied"] / max(1, pt["events"]) * pt["events_per_s_per_worker"] for pt in pts], "s--",
                     label="applied per worker")
        axes[0].set_ylabel("events/s per worker")
        axes[0].set_title("ingest per worker")
        axes[1].plot(xs, [pt["rss_end"] / 2**20 for pt in pts], "o-", label="kvshmd RssAnon (heap, without the rings)")
        axes[1].plot(xs, [pt["daemon_cpu_pct"] for pt in pts], "s--", label="kvshmd CPU %")
        axes[1].set_title("daemon memory (MiB) and CPU (%)")
        axes[2].plot(xs, [pt["query"]["median_us"] / 1e3 for pt in pts], "o-", label="median")
        axes[2].plot(xs, [pt["query"]["p99_us"] / 1e3 for pt in pts], "s--", label="p99")
        axes[2].set_ylabel("ms")
        axes[2].set_title("HTTP Events query latency while all publish")
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("attached workers")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(outdir / "scale_workers.png", dpi=90)
        plt.close(fig)
        made.append("scale_workers.png")
    return made


def node_sizing(d: dict[str, Any]) -> list[str]:
    w = d.get("workers", {}).get("points", [])
    s = d.get("scale", {}).get("points", [])
    if not w or not s:
        return ["(not measured: the workers or scale section was skipped)"]
    top = max((pt for pt in w if pt.get("rate") == d["workers"]["rate"]), key=lambda pt: pt["workers"])
    low = [pt for pt in w if pt.get("rate") != d["workers"]["rate"]]
    big = max(s, key=lambda pt: pt["blocks"])
    near = min(s, key=lambda pt: abs(pt["blocks"] - NODE_BLOCKS_PER_RANK))
    cpu_per_event = top["daemon_cpu_us_per_event"]
    cores = NODE_STREAMS * NODE_EVENTS_PER_RANK * cpu_per_event / 1e6
    per_block = near["bytes_per_block_kvshm"]  # each rank is its own index of about this many blocks
    index_gib = NODE_STREAMS * NODE_BLOCKS_PER_RANK * per_block / 2**30
    rings_gib = NODE_STREAMS * DEFAULT_RING_BYTES / 2**30
    lines = [
        f"Assumptions (bench/results_report.py): {NODE_STREAMS} streams (8 GPUs × 8 dp ranks, one producer per rank), "
        f"{NODE_EVENTS_PER_RANK:.0f} events/s per rank (Stored 32×32 + Removed), {NODE_BLOCKS_PER_RANK:,} resident "
        f"blocks per rank, the default {DEFAULT_RING_BYTES >> 20} MiB ring per producer.",
        "",
        f"* **CPU**: kvshmd spent {cpu_per_event:.1f} µs of CPU per applied event with {top['workers']} workers at "
        f"{d['workers']['rate']:.0f} events/s each (queries included) → {cores:.2f} cores for the node"
        + (f"; but with streams that publish rarely the per-stream idle strategy dominates: {low[0]['workers']} "
           f"workers at {low[0]['rate']:.0f} events/s each cost {low[0]['daemon_cpu_pct']:.0f}% of a core "
           f"({low[0]['daemon_cpu_us_per_event']:.0f} µs per event)." if low else "."),
        f"* **Memory**: {per_block:.0f} B of kvshmd RssAnon per resident block in an index of "
        f"{near['blocks']:,} blocks ({big['bytes_per_block_kvshm']:.0f} B at {big['blocks']:,}) → "
        f"{index_gib:.1f} GiB for {NODE_STREAMS} × {NODE_BLOCKS_PER_RANK:,} blocks; plus the rings, "
        f"{NODE_STREAMS} × {DEFAULT_RING_BYTES >> 20} MiB = {rings_gib:.0f} GiB of /dev/shm once each has wrapped "
        "(shared pages, counted in both the engine's and kvshmd's RSS).",
        f"* **Recovery**: a TreeDump of one rank's {near['blocks']:,} blocks takes "
        f"{us(near['dump']['fresh/kvshm']['median_us'])} fresh, {us(near['dump']['cached/kvshm']['median_us'])} "
        f"cached ({mb(near.get('dump_bytes_kvshm', 0))}).",
        f"* **Ingest headroom**: kvshmd applies {big['ingest_events_per_s']:,.0f} events/s "
        f"({big['ingest_blocks_per_s'] / 1e6:.2f} M blocks/s) in a burst at {big['blocks']:,} resident blocks, "
        f"against the node's {NODE_STREAMS * NODE_EVENTS_PER_RANK:,.0f} events/s.",
    ]
    return lines


def first_limit(d: dict[str, Any]) -> list[str]:
    w = d.get("workers", {}).get("points", [])
    rate = d.get("workers", {}).get("rate")
    main_pts = [pt for pt in w if pt.get("rate", rate) == rate]
    if not main_pts:
        return []
    cores = d["machine"]["cores"] or 1
    out = []
    for pt in w:
        out.append(f"{pt['workers']} workers at {pt.get('rate', rate):.0f} events/s: kvshmd "
                   f"{pt['daemon_cpu_pct']:.0f}% of a core "
                   + (f"({pt['daemon_cpu_us_per_event']:.0f} µs per event), " if pt.get("rate", rate) else "(idle), ")
                   + f"publishers {pt['publisher_cpu_pct']:.0f}%, machine "
                   f"{pt.get('machine_busy_pct', float('nan')):.0f}% of {cores} cores busy, "
                   + (f"query p50 {us(pt['query']['median_us'])} p99 {us(pt['query']['p99_us'])},"
                      if pt.get("queries", True) else "no queries,")
                   + f" dropped {pt['dropped']}, kvshmd RssAnon {pt['rss_end'] / 2**20:.0f} MiB")
    top = max(main_pts, key=lambda pt: pt["workers"])
    one = min(main_pts, key=lambda pt: pt["workers"])
    growth = top["query"]["median_us"] / one["query"]["median_us"] if one["query"]["median_us"] else float("nan")
    if top["dropped"]:
        line = (f"First limit: **ring capacity / drain rate**: {top['dropped']} events dropped at {top['workers']} "
                "workers.")
    elif growth > 3 and top.get("machine_busy_pct", 100.0) >= 85:
        line = (f"First limit: **CPU** on this machine. From {one['workers']} to {top['workers']} publishing "
                f"workers the recovery query median grew {growth:.1f}× ({us(one['query']['median_us'])} → "
                f"{us(top['query']['median_us'])}) while the machine's {cores} cores were "
                f"{top['machine_busy_pct']:.0f}% busy (its other tenants included) and kvshmd itself used "
                f"{top['daemon_cpu_pct']:.0f}% of a core; nothing was dropped and kvshmd's heap stayed at "
                f"{top['rss_end'] / 2**20:.0f} MiB. This run cannot tell the machine's load apart from kvshmd's "
                "scheduling of one drain thread per stream as the cause of the query delay. Events travel through "
                "shared memory, so socket bandwidth carries only the queries and is not a limit.")
    elif growth > 3:
        line = (f"First limit: **query latency under load**. From {one['workers']} to {top['workers']} publishing "
                f"workers the recovery query median grew {growth:.1f}× ({us(one['query']['median_us'])} → "
                f"{us(top['query']['median_us'])}) while kvshmd used {top['daemon_cpu_pct']:.0f}% of a core, the "
                f"machine was {top.get('machine_busy_pct', float('nan')):.0f}% busy, nothing was dropped and memory "
                f"stayed at {top['rss_end'] / 2**20:.0f} MiB: the daemon's scheduling of one drain thread per stream "
                "(each a locked OS thread that spins, yields and sleeps after every record) delays the query "
                "goroutines before CPU, memory or socket bandwidth run out. Events travel through shared memory, so "
                "socket bandwidth carries only the queries.")
    else:
        line = (f"First limit: **CPU** (kvshmd {top['daemon_cpu_pct']:.0f}% of a core at {top['workers']} workers, "
                f"query median ×{growth:.1f}); memory and rings were not limiting.")
    return ["* " + x for x in out] + ["", line]


def splice(text: str, section: list[str], after: str) -> str:
    """``text`` (a rendered RESULTS.md) with ``section`` (starting with its "## " heading) in place of the section of
    the same heading, or, when there is none, inserted before the section that follows the one headed ``after`` (at
    the end without it): ``make bench-dynamo`` re-renders its own section without rerunning ``make bench``."""
    lines = text.splitlines()
    head = section[0]

    def end_of(i: int) -> int:
        j = i + 1
        while j < len(lines) and not lines[j].startswith("## "):
            j += 1
        return j

    if head in lines:
        i = lines.index(head)
        lines[i:end_of(i)] = section
    else:
        at = next((i for i, ln in enumerate(lines) if ln.startswith(after)), None)
        j = len(lines) if at is None else end_of(at)
        lines[j:j] = section
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:2] == ["--splice-dynamo"]:  # make bench-dynamo: RESULTS.md's Dynamo section only
        from dynamo_bench import section as dynamo_section

        out, measured = Path(sys.argv[2]), sys.argv[3]
        out.write_text(splice(out.read_text(), dynamo_section(json.loads(Path(measured).read_text()), measured),
                              "## SGLang"))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--go", default="")
    ap.add_argument("--extra", nargs="*", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--started", type=float, default=0.0, help="epoch seconds when make bench started")
    ap.add_argument("--cluster", default="", help="a make cluster results.json to render (the router-restart curve)")
    ap.add_argument("--sglang", default="", help="a make bench-sglang result to render (SGLang's engine cost)")
    ap.add_argument("--dynamo", default="",
                    help="a make bench-dynamo result to render (the engine core in Dynamo's stack)")
    args = ap.parse_args()
    d: dict[str, Any] = json.loads(Path(args.results).read_text())
    out = Path(args.out)
    made = plots(d, out.parent)
    m = d["machine"]
    L: list[str] = [
        "# kvshm benchmark results",
        "",
        f"Generated by `make bench` ({Path(__file__).name}) on {m['date_utc']} at commit {m['commit']}. Do not edit: "
        "run `make bench` again. Every ratio is kvshm over its baseline measured in the same run, with the two "
        "sides' samples interleaved; medians and p99 over every timed call. A missed goal says MISS with its numbers.",
        "",
        "## Machine",
        "",
        *table(["", ""], [
            ["cores", str(m["cores"])], ["CPU", m["cpu_model"]], ["kernel", m["kernel"]],
            ["memory", f"{m['mem_gib']} GiB"],
            ["Python", m["python"]], ["Go", m["go"]], ["rustc", m["rustc"]], ["reference", m["reference"]],
            ["load average at start / end", f"{m['loadavg_start'][0]:.1f} / {m['loadavg_end'][0]:.1f} "
             "(the machine is shared: other work runs meanwhile)"],
        ]),
        "",
    ]
    total = ""
    if args.started:
        total = f"{(time.time() - args.started) / 60:.1f} min"
        L += [f"`make bench` took {total} (the Python measurements {d['elapsed_s'] / 60:.1f} min of it).", ""]
    L += ["## Skipped", ""]
    L += [f"* {s}" for s in d.get("skipped", [])] or ["Nothing: every comparison ran."]
    L += ["", "## Goals", "", f"From {GOAL_ROWS_DOC}. Ratio = kvshm / baseline (lower is better). The publisher's "
          "goals are in [kvshmd as the publisher](#kvshmd-as-the-publisher).", ""]
    rows = [[g.name, g.target, g.kvshm, g.baseline, ratio_s(g.ratio), "info" if g.note == "info" else verdict(g.ok)]
            for g in goals(d)]
    goal_table = table(["goal", "target", "kvshm", "baseline (same run)", "ratio", "verdict"], rows)
    zmq_rows = [[g.name, g.target, g.kvshm, g.baseline, ratio_s(g.ratio), verdict(g.ok)] for g in zmq_goals(d)]
    print("\n".join(goal_table + table(["publisher goal", "target", "kvshm", "baseline", "ratio", "verdict"],
                                       zmq_rows)))  # make bench prints the goals with their ratios
    L += goal_table
    L += [""]
    heap = None
    floor: dict[float, float] = {}
    if args.go and Path(args.go).exists():
        gos = parse_go(Path(args.go).read_text())
        heap = next((b.metrics.get("heap-B/block") for b in gos
                     if b.name.startswith("BenchmarkHeapPerBlock/impl=arena")), None)
        floor = wake_floors(gos)
    node = node_report.node_section(d, heap, floor)
    print("\n".join(node))  # make bench prints the node's goals too
    L += node
    p = d.get("publish")
    if p:
        L += ["## Publish cost", "",
              f"Each call timed; {p['rounds']} rounds × {p['n']} calls per size and side, sides rotated every round. "
              "Stored events of N blocks × 32 tokens (Python lists) under a resident parent, each followed by the "
              "Removed of its hashes; kvshm's private kvshmd drains meanwhile "
              f"(dropped events: {p['dropped_events']}). Floor: `array('I', tokens)` + `array('Q', hashes)` + one "
              "copy of each into a mapping (Removed: `array('Q', hashes).tobytes()`).", ""]
        rows = []
        for kind in ("stored", "removed"):
            for b in p["sizes"]:
                sm = p["summary"]
                k, r, f = (sm.get(f"{kind}/{b}/{x}") for x in ("kvshm", "ref", "floor"))
                assert k is not None and f is not None
                rows.append([f"apply_{kind}", str(b), us(k["median_us"]), us(k["p99_us"]),
                             us(r["median_us"]) if r else "—", us(r["p99_us"]) if r else "—", us(f["median_us"]),
                             ratio_s(k["median_us"] / r["median_us"]) if r else "—",
                             ratio_s(k["median_us"] / f["median_us"])])
        k, r = p["summary"].get("cleared/kvshm"), p["summary"].get("cleared/ref")
        if k:
            rows.append(["apply_cleared", "—", us(k["median_us"]), us(k["p99_us"]), us(r["median_us"]) if r else "—",
                         us(r["p99_us"]) if r else "—", "—", ratio_s(k["median_us"] / r["median_us"]) if r else "—",
                         "—"])
        L += table(["call", "blocks", "kvshm p50", "kvshm p99", "reference p50", "reference p99", "floor p50",
                    "kvshm/ref", "kvshm/floor"], rows)
        L += ["", "![publish cost](publish_cost.png)", ""]
    L += zmq_section(d)
    if args.cluster and Path(args.cluster).exists():
        L += cluster_section(json.loads(Path(args.cluster).read_text()), args.cluster)
    if args.sglang and Path(args.sglang).exists():
        from sglang_bench import section as sglang_section  # stdlib only at import: no SGLang needed here

        L += sglang_section(json.loads(Path(args.sglang).read_text()), args.sglang)
    if args.dynamo and Path(args.dynamo).exists():
        from dynamo_bench import section as dynamo_section  # stdlib only at import: no Dynamo needed here

        L += dynamo_section(json.loads(Path(args.dynamo).read_text()), args.dynamo)
    q = d.get("queries")
    if q:
        L += ["## Queries (Python API, in-process reference vs kvshm.LocalIndexer → private kvshmd)", "",
              f"{q['blocks']:,} resident blocks in chains of 8 Stored events × 32 blocks × 32 tokens "
              f"({q['events_applied']:,} event ids). A fresh dump follows an id gap, which invalidates the dump cache "
              "of both sides.", ""]
        rows = []
        for case in ("events10", "toonew", "invalid", "dump_fresh", "dump_cached"):
            k, r = q["summary"].get(f"{case}/kvshm"), q["summary"].get(f"{case}/ref")
            assert k is not None
            ik = q["info"]["kvshm"][case]
            ident = q["info"].get("identical", {}).get(case)
            rows.append([case, f"{ik['variant']}, {ik['bytes']:,} B, {ik['events']} events", us(k["median_us"]),
                         us(k["p99_us"]), us(r["median_us"]) if r else "—", us(r["p99_us"]) if r else "—",
                         ratio_s(k["median_us"] / r["median_us"]) if r else "—",
                         "—" if ident is None else (ident if isinstance(ident, str) else ("yes" if ident else "no"))])
        L += table(["query", "kvshm reply", "kvshm p50", "kvshm p99", "reference p50", "reference p99", "ratio",
                    "identical to the reference"], rows)
        L += ["", "![query latency CDFs](query_latency_cdf.png)", ""]
    dep = d.get("deployment")
    if dep:
        L += ["## The deployment: kvshmd --http vs the engine serving /kv_recover", "",
              f"Two engine processes, each holding {dep['blocks']:,} resident blocks and publishing Stored/Removed "
              f"pairs of 32×32 at {dep['pub_rate']:.0f} events/s: one publishes into kvshm.LocalIndexer and a shared "
              "`kvshmd serve --http` answers /kv_recover; the other holds the reference module and answers "
              "/kv_recover itself through ThreadingHTTPServer (as the vLLM fork does). A consumer GETs /kv_recover "
              f"at {dep['qps']:.0f} requests/s (Events for the 10 newest ids; every {dep['dump_every']}th a TreeDump), "
              f"a new connection each. {dep['rounds']} rounds × (quiet, traffic) phases of {dep['seconds']:.0f} s per "
              "engine, engines alternating.", ""]
        rows = []
        for side, label in (("kvshm", "kvshmd --http"), ("ref", "engine-served")):
            s = dep["sides"].get(side)
            if not s:
                continue
            for kind in ("Events", "TreeDump"):
                h = s.get(f"http_{kind}", {"median_us": float("nan"), "p99_us": float("nan"), "n": 0})
                idle = dep["idle"].get(f"{kind}/{side}", {"median_us": float("nan")})
                rows.append([label, kind, us(idle["median_us"]), us(h["median_us"]), us(h["p99_us"]), str(h["n"])])
        L += table(["path", "reply", "p50 idle (alternating)", "p50 while publishing", "p99 while publishing", "n"],
                   rows)
        L += [""]
        rows = []
        for side, label in (("kvshm", "kvshm engine"), ("ref", "engine serving /kv_recover")):
            s = dep["sides"].get(side)
            if not s:
                continue
            for phase in ("quiet", "traffic"):
                a = s[phase]["apply_stored"]
                rows.append([label, phase, us(a["median_us"]), us(a["mean_us"]), us(a["p99_us"]),
                             f"{s[phase]['engine_cpu_pct']:.1f}%",
                             f"{s[phase]['daemon_cpu_pct']:.1f}%" if side == "kvshm" else "—"])
        L += table(["engine", "phase", "apply_stored p50", "mean", "p99", "engine CPU", "kvshmd CPU"], rows)
        others = {side: s.get("other_replies") for side, s in dep["sides"].items() if s.get("other_replies")}
        if others:
            L += ["", f"Replies other than Events/TreeDump during traffic: {others}"]
        L += [""]
    s = d.get("scale")
    if s:
        L += ["## Scale: resident blocks", "",
              "One kvshm.LocalIndexer and one reference (its own process) grown together with "
              "root chains of 256 blocks; kvshm's side is a shared `kvshmd serve --http` (no checkpoints), "
              "timed through "
              "the Python API (kvshm.LocalIndexer.get_events_json) and through a consumer's HTTP GET /kv_recover "
              "(http.client, new connection). Memory: RssAnon growth over the empty process divided by the blocks "
              "(kvshmd's Go heap includes garbage not yet collected; the ring is shared memory, not counted). Ingest: "
              f"kvshmd stopped (SIGSTOP), {s['ingest_events']:,} Stored/Removed events of 32 blocks published, "
              "resumed; time until a query's read-your-writes barrier returns.", ""]
        rows = []
        nan = {"median_us": float("nan")}
        for pt in s["points"]:
            dm = pt["dump"]

            def cell(kind: str, side: str, dm: dict[str, Any] = dm) -> str:
                a, r = dm.get(f"{kind}/{side}", nan)["median_us"], dm.get(f"{kind}/ref", nan)["median_us"]
                return f"{us(a)} ({ratio_s(a / r)})" if r == r else us(a)

            rows.append([f"{pt['blocks']:,}", cell("fresh", "kvshm"), cell("fresh", "kvshm_http"),
                         us(dm.get("fresh/ref", nan)["median_us"]), cell("cached", "kvshm"),
                         cell("cached", "kvshm_http"), us(dm.get("cached/ref", nan)["median_us"]),
                         f"{mb(pt.get('dump_bytes_kvshm', 0))} / {mb(pt.get('dump_bytes_ref', 0))}",
                         f"{pt['bytes_per_block_kvshm']:.0f} / {pt.get('bytes_per_block_ref', float('nan')):.0f}",
                         f"{pt.get('go_memstats_heap_alloc_bytes', float('nan')) / 2**20:,.0f} MiB",
                         f"{pt['ingest_events_per_s']:,.0f} ev/s ({pt['ingest_blocks_per_s'] / 1e6:.2f} M blocks/s)",
                         f"{pt['fill_s_kvshm']:.1f} / {pt.get('fill_s_ref', float('nan')):.1f}",
                         str(pt.get("dropped_kvshm", "?"))])
        L += table(["blocks", "dump fresh: kvshm Python API (vs ref)", "kvshm HTTP GET (vs ref)", "reference",
                    "dump cached: kvshm Python API (vs ref)", "kvshm HTTP GET (vs ref)", "reference",
                    "dump bytes kvshm / ref", "B/block kvshmd / ref (RssAnon)", "kvshmd Go heap_alloc",
                    "kvshmd ingest", "fill s kvshm / ref", "dropped"], rows)
        L += ["", "![scale: resident blocks](scale_blocks.png)", ""]
    w = d.get("workers")
    if w:
        L += ["## Scale: one shared kvshmd, many attached workers", "",
              f"Workers spread over {w['points'][0]['publisher_procs'] if w['points'] else 0}–2 publisher processes, "
              f"each worker publishing Stored/Removed pairs of 32×32 at {w['rate']:.0f} events/s for "
              f"{w['seconds']:.0f} s; meanwhile a consumer asks a random worker's "
              f"/workers/{{w}}/kv_recover for its newest events ({w['qps']:.0f}/s target, one at a time). The "
              "low-rate and idle (rate 0) runs have no queries (what the streams themselves cost kvshmd), and begin "
              "with the same kvshmd's CPU with nothing attached.", ""]
        rows = []
        for pt in w["points"]:
            rows.append([str(pt["workers"]), f"{pt.get('rate', w['rate']):.0f}", f"{pt['events_per_s_per_worker']:.0f}",
                         f"{pt['applied']:,} / {pt['events']:,}", str(pt["dropped"]),
                         f"{pt['daemon_cpu_pct']:.0f}%",
                         f"{pt['daemon_cpu_us_per_event']:.1f}" if pt.get("rate", w["rate"]) else "—",
                         f"{pt['rss_start'] / 2**20:.0f} → {pt['rss_end'] / 2**20:.0f} MiB "
                         f"({pt.get('vmrss_end', 0) / 2**20:.0f} MiB)",
                         us(pt["query"]["median_us"]), us(pt["query"]["p99_us"]), str(pt["query"]["n"]),
                         f"{pt.get('machine_busy_pct', float('nan')):.0f}%"])
        L += table(["workers", "target events/s per worker", "published events/s per worker", "applied / published",
                    "dropped", "kvshmd CPU", "kvshmd CPU µs/event", "kvshmd RssAnon (VmRSS with rings)", "query p50",
                    "query p99", "queries", "machine busy"], rows)
        L += ["", "![scale: workers](scale_workers.png)", "", *first_limit(d), "",
              "### What a node of 8 GPUs × 8 dp ranks needs", "", *node_sizing(d), ""]
    if args.go and Path(args.go).exists():
        gb = parse_go(Path(args.go).read_text())
        L += ["## Go benchmarks", "",
              "`go test -bench` as `make bench` runs them (see the Makefile); ratio metrics (x-baseline, x-heap, "
              "ratio_vs_unloaded) are against baselines measured in the same benchmark.", ""]
        rows = []
        for b in gb:
            rest = ", ".join(f"{v:g} {u}" for u, v in b.metrics.items() if u != "ns/op")
            rows.append([f"`{b.name}`", str(b.iterations), f"{b.metrics.get('ns/op', float('nan')):,.0f}", rest])
        L += table(["benchmark", "iterations", "ns/op", "other metrics"], rows)
        L += [""]
    for extra in args.extra:
        path = Path(extra)
        if path.exists():
            L += [f"## {path.stem}", "", "```", path.read_text().rstrip(), "```", ""]
    L += ["Plots: " + ", ".join(f"[{m}]({m})" for m in made), ""]
    out.write_text("\n".join(L))
    for skipped in d.get("skipped", []):
        print(f"SKIPPED: {skipped}")
    print(f"wrote {out} and {len(made)} plots")


if __name__ == "__main__":
    main()
