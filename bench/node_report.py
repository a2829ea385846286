"""The "Node" section of RESULTS.md: what kvshm costs the whole node (engine process + kvshmd) against what
it replaces, each goal with its baseline from the same run, PASS or MISS, and for a MISS the measured figures that
bound it. Every figure comes from recovery_bench.py's JSON (sections zmq, workers, publish, queries, scale) and the
Go benchmarks' output; nothing is measured here.
"""

from __future__ import annotations

from typing import Any

from _report import Goal, ratio_s, table, us, verdict

NODE_CPU_LIMIT = 0.6  # (engine + kvshmd) CPU per batch / the reference engine's
IDLE_PCT_LIMIT = 0.2  # kvshmd, 64 attached idle streams, % of a core
LOW_RATE_PCT_LIMIT = 2.0  # kvshmd, 64 streams at 10 events/s each, % of a core
QUERY_P50_US, QUERY_P99_US = 1000.0, 5000.0  # Events (newest 10) with 64 streams at 400 events/s
LATENCY_P99_US = 1000.0  # publish -> subscriber at 1,000 batches/s
APPLY_SLACK = 1.10  # the engine's apply cost: no worse than +10% against today
RSS_LIMIT = 1.0  # kvshmd RssAnon per resident block / the reference's
RSS_SIZES = (100_000, 1_000_000, 10_000_000)
EVENTS_LIMIT = 1.5  # get_events_json, 10 recent events / reference
DUMP_LIMIT = 1.0  # TreeDump 100k blocks, fresh / reference

# "Today" for the engine-side goal: the same-run ratios in bench/RESULTS.md of 2026-12-01 (commit e31c451), the
# run the node goals were set against. apply_stored is compared with the floor (array conversion + one copy, measured in
# every run beside it), apply_batch with (a), the engine's own msgspec + pyzmq publisher + the reference indexer
# (inline, all work on the timing thread). A run's ratio may be at most APPLY_SLACK x today's: the machine's speed
# cancels out, a change in kvshm's own cost does not.
TODAY_COMMIT = "e31c451"
TODAY_STORED_VS_FLOOR = 6.94 / 6.13  # apply_stored 32x32 p50 / floor p50
TODAY_BATCH_VS_A = 9.49 / 30.93  # apply_batch 32x32 Stored p50 / (a) p50


def _node_cpu(d: dict[str, Any], wake_floor_us: dict[float, float] | None = None) -> list[Goal]:
    z = d.get("zmq") or {}
    runs: list[tuple[float, dict[str, Any]]] = []
    if z.get("threaded"):
        runs.append((float(z["rate"]), z["threaded"]))
    for r, th in sorted((z.get("node") or {}).items(), key=lambda kv: float(kv[0])):
        runs.append((float(r), th))
    runs.sort(key=lambda x: x[0])
    out = []
    for rate, th in runs:
        a, c = th.get("headline/a"), th.get("headline/c")
        name = (f"node CPU per batch (engine process + kvshmd, from /proc), 32×32 Stored with kvshmd publishing, "
                f"{rate:,.0f} batches/s")
        target = f"≤ {NODE_CPU_LIMIT}× reference engine"
        if not a or not c or c.get("daemon_cpu_us") is None:
            out.append(Goal(name, target, "(c): skipped" if not c else "kvshmd CPU not measured",
                            "(a): skipped" if not a else f"(a) {us(a['engine_cpu_us'])}", None, None))
            continue
        node = c["engine_cpu_us"] + c["daemon_cpu_us"]
        r = node / a["engine_cpu_us"]
        limit = (f"at {rate:,.0f} batches/s kvshmd spends {us(c['daemon_cpu_us'])} of the node's {us(node)} per "
                 f"batch ({100 * c['daemon_cpu_us'] / node:.0f}%), the engine process {us(c['engine_cpu_us'])}; the "
                 f"reference engine spends {us(a['engine_cpu_us'])} in all. Even with kvshmd free the engine side "
                 f"alone is {c['engine_cpu_us'] / a['engine_cpu_us']:.2f}× the reference.")
        floor = (wake_floor_us or {}).get(rate)
        if floor:
            limit += (f" The floor of any consumer in a process of its own at this rate (BenchmarkWakeFloor, this "
                      f"run: a Go process that only parks on the ring's doorbell and drains a Python RingWriter's "
                      f"records) is "
                      f"{us(floor)} of CPU per wakeup; kvshmd's {us(c['daemon_cpu_us'])} per batch is "
                      f"{c['daemon_cpu_us'] / floor:.1f}× that floor, and engine + floor alone would be "
                      f"{(c['engine_cpu_us'] + floor) / a['engine_cpu_us']:.2f}× the reference.")
        out.append(Goal(name, target,
                        f"engine {us(c['engine_cpu_us'])} + kvshmd {us(c['daemon_cpu_us'])} = {us(node)}",
                        f"reference engine (a) {us(a['engine_cpu_us'])} ({a['engine_cpu_pct']:.1f}% of a core)", r,
                        r <= NODE_CPU_LIMIT, limit=limit))
    return out


def _workers(d: dict[str, Any]) -> list[Goal]:
    w = d.get("workers") or {}
    pts = w.get("points", [])
    if not pts:
        return []
    most = max(pt["workers"] for pt in pts)
    out = []
    for rate, label, lim in ((0.0, f"kvshmd CPU, {most} attached idle streams", IDLE_PCT_LIMIT),
                             (float(d.get("config", {}).get("worker_low_rate", 10.0)),
                              f"kvshmd CPU, {most} streams at {{rate:.0f}} events/s each", LOW_RATE_PCT_LIMIT)):
        pt = next((p for p in pts if p["workers"] == most and p.get("rate") == rate and not p.get("queries")), None)
        name = label.format(rate=rate)
        if pt is None:
            out.append(Goal(name, f"≤ {lim}% of a core", "not measured", "—", None, None))
            continue
        empty = pt.get("empty_daemon_cpu_pct")
        added = pt["daemon_cpu_pct"] - (empty or 0.0)
        per_stream = 1e4 * added / most  # µs of CPU per second per stream
        limit = ""
        if empty is not None:
            limit = (f"the streams add {added:.2f}% of a core to kvshmd's {empty:.2f}% with nothing attached: "
                     f"{per_stream:.1f} µs of CPU per stream per second")
            if rate:
                limit += f", {1e4 * added / (rate * most):.0f} µs per event"
        out.append(Goal(name, f"≤ {lim}% of a core", f"{pt['daemon_cpu_pct']:.2f}% of a core (no queries)",
                        f"the same kvshmd with nothing attached: {empty:.2f}%" if empty is not None else "—",
                        pt["daemon_cpu_pct"] / empty if empty else None, pt["daemon_cpu_pct"] <= lim, limit=limit))
    busy = [p for p in pts if p.get("rate") == w.get("rate") and p.get("queries", True)]
    if busy:
        top = max(busy, key=lambda p: p["workers"])
        one = min(busy, key=lambda p: p["workers"])
        q, q1 = top["query"], one["query"]
        ok = q["n"] > 0 and q["median_us"] <= QUERY_P50_US and q["p99_us"] <= QUERY_P99_US
        limit = (f"with {top['workers']} streams at {top['rate']:.0f} events/s kvshmd used "
                 f"{top['daemon_cpu_pct']:.0f}% of a core and the machine was "
                 f"{top.get('machine_busy_pct', float('nan')):.0f}% busy (of {d['machine']['cores']} cores); the "
                 f"query median is {q['median_us'] / q1['median_us']:.1f}× its {one['workers']}-stream figure")
        out.append(Goal(f"recovery query (Events, newest 10, HTTP) with {top['workers']} streams at "
                        f"{top['rate']:.0f} events/s", f"p50 ≤ {us(QUERY_P50_US)}, p99 ≤ {us(QUERY_P99_US)}",
                        f"p50 {us(q['median_us'])}, p99 {us(q['p99_us'])} ({q['n']} queries)",
                        f"{one['workers']} stream: p50 {us(q1['median_us'])}, p99 {us(q1['p99_us'])}",
                        q["median_us"] / q1["median_us"] if q1["median_us"] else None, ok, limit=limit))
    return out


def _latency(d: dict[str, Any]) -> list[Goal]:
    z = d.get("zmq") or {}
    th = z.get("threaded") or {}
    a, c = th.get("headline/a"), th.get("headline/c")
    if not c:
        return []
    lc = c["latency"]
    base = f"(a) pyzmq publisher thread: p50 {us(a['latency']['median_us'])}, p99 {us(a['latency']['p99_us'])}" \
        if a else "(a): skipped"
    return [Goal(f"publish → subscriber p99, 32×32 Stored, {z['rate']:,.0f} batches/s", f"p99 ≤ {us(LATENCY_P99_US)}",
                 f"kvshmd: p50 {us(lc['median_us'])}, p99 {us(lc['p99_us'])}", base,
                 lc["p99_us"] / a["latency"]["p99_us"] if a and a["latency"]["n"] else None,
                 bool(lc["n"]) and lc["p99_us"] <= LATENCY_P99_US,
                 limit=f"{lc['n']} batches received; p50 {us(lc['median_us'])}")]


def _apply(d: dict[str, Any]) -> list[Goal]:
    out = []
    p = (d.get("publish") or {}).get("summary", {})
    kv, fl = p.get("stored/32/kvshm"), p.get("stored/32/floor")
    target = f"ratio ≤ {APPLY_SLACK:.2f}× today's"
    if kv and fl:
        r = kv["median_us"] / fl["median_us"]
        out.append(Goal("engine: `apply_stored` 32×32 / floor, against today's ratio", target,
                        f"{us(kv['median_us'])} / floor {us(fl['median_us'])} = {r:.2f}×",
                        f"today ({TODAY_COMMIT}): {TODAY_STORED_VS_FLOOR:.2f}×", r / TODAY_STORED_VS_FLOOR,
                        r <= APPLY_SLACK * TODAY_STORED_VS_FLOOR,
                        limit=f"p99 {us(kv['p99_us'])} against the floor's {us(fl['p99_us'])}"))
    inl = ((d.get("zmq") or {}).get("inline") or {}).get("summary", {})
    c, a = inl.get("headline/c"), inl.get("headline/a")
    if c and a:
        r = c["median_us"] / a["median_us"]
        out.append(Goal("engine: `apply_batch` 32×32 Stored (kvshmd publishes) / (a), against today's ratio", target,
                        f"{us(c['median_us'])} / (a) {us(a['median_us'])} = {r:.2f}×",
                        f"today ({TODAY_COMMIT}): {TODAY_BATCH_VS_A:.2f}×", r / TODAY_BATCH_VS_A,
                        r <= APPLY_SLACK * TODAY_BATCH_VS_A,
                        limit=f"p99 {us(c['p99_us'])} against (a)'s {us(a['p99_us'])}"))
    return out


def _memory(d: dict[str, Any], heap_per_block: float | None) -> list[Goal]:
    pts = {p["blocks"]: p for p in (d.get("scale") or {}).get("points", [])}
    if not pts:
        return []
    out = []
    for n in RSS_SIZES:
        name = f"kvshmd RssAnon per resident block, {n:,} blocks"
        p = pts.get(n)
        if p is None:
            out.append(Goal(name, f"≤ {RSS_LIMIT}× reference", "not measured (--scale-sizes)", "—", None, None))
            continue
        kv, ref = p["bytes_per_block_kvshm"], p.get("bytes_per_block_ref")
        heap = p.get("go_memstats_heap_alloc_bytes", float("nan")) / n
        limit = (f"Go heap_alloc {heap:.0f} B/block of the {kv:.0f} B/block RssAnon (the rest: collector headroom, "
                 "freed pages not returned)"
                 + (f"; the index itself {heap_per_block:.0f} B/block (BenchmarkHeapPerBlock/impl=arena)"
                    if heap_per_block else ""))
        out.append(Goal(name, f"≤ {RSS_LIMIT}× reference", f"{kv:.0f} B", f"reference {ref:.0f} B" if ref else
                        "reference: skipped", kv / ref if ref else None, kv / ref <= RSS_LIMIT if ref else None,
                        limit=limit))
    return out


def _queries(d: dict[str, Any]) -> list[Goal]:
    q = (d.get("queries") or {}).get("summary", {})
    blocks = (d.get("queries") or {}).get("blocks", 0)
    out = []
    for key, name, lim in (("events10", "`get_events_json`, 10 recent events", EVENTS_LIMIT),
                           ("dump_fresh", f"TreeDump, {blocks:,} blocks, fresh", DUMP_LIMIT)):
        a, b = q.get(f"{key}/kvshm"), q.get(f"{key}/ref")
        if not a:
            continue
        r = a["median_us"] / b["median_us"] if b else None
        out.append(Goal(name, f"≤ {lim}× reference", f"{us(a['median_us'])} (p99 {us(a['p99_us'])})",
                        f"reference {us(b['median_us'])} (p99 {us(b['p99_us'])})" if b else "reference: skipped", r,
                        r <= lim if r is not None else None,
                        limit=f"kvshm is {us(a['median_us'] - b['median_us'])} slower per call" if b else ""))
    return out


def node_goals(d: dict[str, Any], heap_per_block: float | None = None,
               wake_floor_us: dict[float, float] | None = None) -> list[Goal]:
    """The node goal rows, in a fixed order. wake_floor_us: BenchmarkWakeFloor's consumer CPU per wakeup by
    rate (batches/s), from the Go benchmarks of the same run."""
    return [*_node_cpu(d, wake_floor_us), *_workers(d), *_latency(d), *_apply(d), *_memory(d, heap_per_block),
            *_queries(d)]


def node_section(d: dict[str, Any], heap_per_block: float | None = None,
                 wake_floor_us: dict[float, float] | None = None) -> list[str]:
    gs = node_goals(d, heap_per_block, wake_floor_us)
    if not gs:
        return []
    z = d.get("zmq") or {}
    w = d.get("workers") or {}
    L = ["## Node", "",
         "What kvshm costs the node against what it replaces: the reference engine is vLLM's way (msgspec + a pyzmq "
         "publisher thread + the in-process LocalKvIndexer, side (a) of [kvshmd as the publisher]"
         "(#kvshmd-as-the-publisher)); kvshm's side is the engine process plus kvshmd. CPU is counted from "
         "/proc: the engine processes' user+system time (getrusage, every thread) minus an idle engine running the "
         "same pacing loop, and kvshmd's per-thread time on a CPU (/proc/PID/task/*/schedstat, ns). Node CPU: "
         f"{z.get('threaded_rounds', 3)} rounds per rate, sides rotated, {z.get('seconds', 2):g} s per round at "
         f"{z.get('rate', 1000):,.0f}/s and {z.get('node_seconds', 3):g} s at the other rates. kvshmd CPU with idle "
         f"and low-rate streams: {w.get('seconds', 6):g} s, no queries, after the same kvshmd's CPU with nothing "
         "attached (its baseline). Queries under load, memory and query latency: the sections below.", ""]
    rows = [[g.name, g.target, g.kvshm, g.baseline, ratio_s(g.ratio), verdict(g.ok)] for g in gs]
    L += table(["goal", "target", "kvshm", "baseline (same run)", "ratio", "verdict"], rows)
    misses = [g for g in gs if g.ok is False]
    if misses:
        L += ["", "Each MISS with the figures that bound it (this run):", ""]
        L += [f"* {g.name}: {(g.limit or 'no limit measured').rstrip('.')}." for g in misses]
    L += [""]
    return L
