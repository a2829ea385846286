"""Tests of the RESULTS.md generator: Go output parsing and the goal verdicts (make bench runs these first)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import results_report as rr  # noqa: E402

GO_OUT = """goos: linux
pkg: github.com/kvshm/kvshm/index
BenchmarkApplyStored/blocks=32-2         	  150000	      7510 ns/op	 4.26 M_blocks/s	     0 B/op	       0 allocs/op
BenchmarkRingPublish-2   	 1000000	      1050 ns/op	         1.31 x-baseline
BenchmarkTreeDump/blocks=100000/cached   	       3	  4100000 ns/op
PASS
ok  	github.com/kvshm/kvshm/index	3.1s
"""


def test_parse_go_keeps_results_and_drops_the_gomaxprocs_suffix() -> None:
    got = rr.parse_go(GO_OUT)
    assert [b.name for b in got] == ["BenchmarkApplyStored/blocks=32", "BenchmarkRingPublish",
                                     "BenchmarkTreeDump/blocks=100000/cached"]
    assert got[0].iterations == 150000
    assert got[0].metrics == {"ns/op": 7510.0, "M_blocks/s": 4.26, "B/op": 0.0, "allocs/op": 0.0}
    assert got[1].metrics["x-baseline"] == 1.31


def s(median: float, p99: float | None = None) -> dict[str, float]:
    return {"n": 10, "median_us": median, "p99_us": p99 or median, "mean_us": median}


def results(events_kv: float, events_ref: float | None) -> dict[str, Any]:
    q = {"events10/kvshm": s(events_kv), "toonew/kvshm": s(50.0), "invalid/kvshm": s(50.1)}
    if events_ref is not None:
        q["events10/ref"] = s(events_ref)
    return {"queries": {"summary": q, "blocks": 100_000, "info": {}}}


@pytest.mark.parametrize(
    ("kv", "ref", "ok"),
    [
        (150.0, 100.0, True),  # exactly 1.5x the reference: met
        (151.0, 100.0, False),  # just over: MISS
        (10.0, None, None),  # no reference: skipped, never PASS
    ],
)
def test_events_goal_is_a_ratio_against_the_same_run_reference(kv: float, ref: float | None, ok: bool | None) -> None:
    (g,) = [g for g in rr.goals(results(kv, ref)) if "10 recent events" in g.name]
    assert g.ok is ok
    assert rr.verdict(g.ok) == {True: "**PASS**", False: "**MISS**", None: "skipped"}[ok]


def test_absolute_goals_use_the_median() -> None:
    gs = {g.name: g for g in rr.goals(results(1.0, 1.0))}
    assert gs["`get_events_json` → TooNew"].ok is True  # 50 µs: met
    assert gs["`get_events_json` → InvalidRange"].ok is False  # 50.1 µs: missed


def test_publish_cost_goal_compares_the_engine_with_and_without_traffic() -> None:
    def side(quiet: float, traffic: float) -> dict[str, Any]:
        return {"quiet": {"apply_stored": s(quiet), "engine_cpu_pct": 1.0, "daemon_cpu_pct": 0.0},
                "traffic": {"apply_stored": s(traffic), "engine_cpu_pct": 2.0, "daemon_cpu_pct": 0.0}}

    d = {"deployment": {"sides": {"kvshm": side(10.0, 11.5), "ref": side(10.0, 20.0)}}}
    (g,) = [g for g in rr.goals(d) if "under recovery traffic" in g.name]
    assert g.ok is False and g.ratio == pytest.approx(1.15)
    assert "+100%" in g.baseline


def point(workers: int, query_us: float, busy: float, dropped: int = 0) -> dict[str, Any]:
    return {"workers": workers, "rate": 400.0, "daemon_cpu_pct": 30.0, "daemon_cpu_us_per_event": 10.0,
            "publisher_cpu_pct": 5.0, "machine_busy_pct": busy, "query": s(query_us), "dropped": dropped,
            "rss_end": 2**20}


@pytest.mark.parametrize(
    ("points", "want"),
    [
        ([point(1, 1000, 50), point(64, 1200, 60)], "**CPU** (kvshmd"),  # latency flat: CPU is named
        ([point(1, 1000, 50), point(64, 30000, 95)], "**CPU** on this machine"),  # saturated machine
        ([point(1, 1000, 50), point(64, 30000, 40)], "**query latency under load**"),  # idle machine, slow queries
        ([point(1, 1000, 50), point(64, 1000, 40, dropped=5)], "**ring capacity / drain rate**"),
    ],
)
def test_first_limit_follows_the_measurements(points: list[dict[str, Any]], want: str) -> None:
    d = {"machine": {"cores": 2}, "workers": {"rate": 400.0, "points": points}}
    assert want in rr.first_limit(d)[-1]


def dump(*events: tuple[int, int]) -> str:
    """A TreeDump JSON of events given as (event_id, block_hash)."""
    evs = [{"worker_id": 1, "event": {"event_id": i, "data": {"stored": {"blocks": [{"block_hash": h}]}}}}
           for i, h in events]
    return json.dumps({"TreeDump": {"events": evs, "last_event_id": 9, "reset_scope": "all"}})


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (dump((0, 5), (1, 6)), dump((0, 5), (1, 6)), "yes"),
        (dump((0, 5), (1, 6)), dump((0, 6), (1, 5)), "same events, order differs"),  # ids are positions
        (dump((0, 5), (1, 6)), dump((0, 5), (1, 7)), "no"),
        (dump((0, 5)), '{"Events": {"events": [], "last_event_id": 9}}', "no"),
    ],
)
def test_same_reply_tells_order_apart_from_content(a: str, b: str, want: str) -> None:
    assert _common.same_reply(a, b) == want


def zmq_results(a_us: float | None, c_us: float | None, c_p99_lat: float = 500.0,
                received: int = 2000) -> dict[str, Any]:
    """A zmq section (zmq_bench.run's shape) with sides a and c (each when given), b always."""
    inline: dict[str, Any] = {}
    threaded: dict[str, Any] = {}
    sides = {"a": a_us, "b": 20.0, "c": c_us}
    for w in ("headline", "mix"):
        for side, v in sides.items():
            if v is None:
                continue
            inline[f"{w}/{side}"] = s(v, 2 * v)
            if side != "c":
                inline[f"{w}/{side}/send"] = s(v / 2)
                inline[f"{w}/{side}/apply"] = s(v / 2)
            lat = c_p99_lat if side == "c" else 300.0
            threaded[f"{w}/{side}"] = {
                "batches": 2000, "rate": 1000.0, "received": received if side == "c" else 2000,
                "engine_cpu_us": 2 * v, "engine_cpu_pct": 0.2 * v, "raw_engine_cpu_us": 2 * v + 20,
                "scheduler_cpu_us": v, "publisher_cpu_us": v, "other_cpu_us": 1.0,
                "daemon_cpu_us": 50.0 if side != "a" else None, "dropped": 0, "publish_call": s(v),
                "payload_bytes_mean": 4645.0,
                "latency": s(lat / 2, lat) if received else {"n": 0, "median_us": float("nan"),
                                                             "p99_us": float("nan"), "mean_us": float("nan")}}
        threaded[f"{w}/idle"] = {"batches": 2000, "rate": 1000.0, "received": 0, "engine_cpu_us": 0.0,
                                 "engine_cpu_pct": 0.0, "raw_engine_cpu_us": 20.0, "scheduler_cpu_us": 0.0,
                                 "publisher_cpu_us": 0.0, "other_cpu_us": 0.0, "daemon_cpu_us": None, "dropped": 0,
                                 "publish_call": s(1.0), "latency": s(1.0)}
    skipped = [] if c_us is not None else ["ZMQ side (c), kvshmd publishing: no apply_batch"]
    return {"zmq": {"sides": [k for k, v in sides.items() if v is not None], "skipped": skipped, "rounds": 10,
                    "n": 200, "rate": 1000.0, "seconds": 2.0, "threaded_rounds": 3, "elapsed_s": 60.0,
                    "inline_s": 20.0,
                    "inline": {"summary": inline, "dropped": {"b": 0}, "payload_bytes": {"headline": 4645, "mix": 3000}},
                    "threaded": threaded}}


@pytest.mark.parametrize(
    ("a", "c", "ok"),
    [
        (100.0, 40.0, True),  # exactly 0.4x (a): met
        (100.0, 40.5, False),  # just over: MISS
        (None, 10.0, None),  # no reference: skipped, never PASS
        (100.0, None, None),  # kvshm without apply_batch: skipped
    ],
)
def test_zmq_cost_goals_are_c_over_a_in_the_same_run(a: float | None, c: float | None, ok: bool | None) -> None:
    gs = [g for g in rr.zmq_goals(zmq_results(a, c)) if g.target == "≤ 0.4× (a)"]
    assert len(gs) == 4  # inline and threaded CPU, for both workloads
    assert all(g.ok is ok for g in gs)
    if ok is not None:
        assert all(g.ratio == pytest.approx((c or 0) / (a or 1)) for g in gs)


@pytest.mark.parametrize(
    ("p99", "received", "ok"),
    [
        (1000.0, 2000, True),  # exactly 1 ms: met
        (1001.0, 2000, False),
        (500.0, 0, False),  # kvshmd published nothing the subscriber saw: MISS, not skipped
    ],
)
def test_zmq_latency_goal_is_kvshmds_p99(p99: float, received: int, ok: bool) -> None:
    gs = [g for g in rr.zmq_goals(zmq_results(100.0, 30.0, p99, received)) if "latency" in g.name]
    assert len(gs) == 2 and all(g.ok is ok for g in gs)
    assert all("(a) pyzmq publisher thread" in g.baseline for g in gs)


def test_zmq_section_renders_with_and_without_kvshm_publishing() -> None:
    full = "\n".join(rr.zmq_section(zmq_results(100.0, 30.0)))
    assert "## kvshmd as the publisher" in full
    assert "| 32×32 Stored | (c) kvshm `apply_batch`, kvshmd publishes | 30.00 µs | 60.00 µs |" in full
    assert "| 32×32 Stored | kvshmd | 250 µs | 500 µs | 2,000 / 2,000 | 4,645 B |" in full
    assert full.count("**PASS**") == 6
    partial = "\n".join(rr.zmq_section(zmq_results(100.0, None)))
    assert "SKIPPED: ZMQ side (c)" in partial and "kvshmd |" not in partial
    assert partial.count("| skipped |") == 6
    assert rr.zmq_section({}) == []


def test_zmq_reading_says_what_stays_on_the_scheduler_thread() -> None:
    th = zmq_results(100.0, 30.0)["zmq"]["threaded"]
    lines = rr.zmq_threads_reading(th)
    assert len(lines) == 2  # one per workload
    assert "of which 100 µs on the scheduler thread" in lines[0]
    assert "The scheduler thread pays no more with (c)" in lines[0]
    th["headline/c"]["scheduler_cpu_us"] = 150.0  # (c) all on the scheduler thread, more than (a) puts there
    assert "(c) trades 50.00 µs more there for 140 µs less in the engine process" in rr.zmq_threads_reading(th)[0]
    assert rr.zmq_threads_reading(zmq_results(100.0, None)["zmq"]["threaded"]) == []


def test_wake_floors_by_rate() -> None:
    gos = rr.parse_go("BenchmarkWakeFloor/rate=100-2  3  1000978123 ns/op  94.00 consumer_us/wake  0.94 pct_core\n"
                      "BenchmarkWakeFloor/rate=1000-2 3  1000904729 ns/op  44.85 consumer_us/wake  4.485 pct_core\n"
                      "BenchmarkDaemonProcCPU/streams=0/idle-2 5 1000197030 ns/op 0 kvshmd_pct_core\n")
    assert rr.wake_floors(gos) == {100.0: 94.0, 1000.0: 44.85}


def test_cluster_section_puts_kvshm_beside_vllm_and_judges_64_nodes() -> None:
    def row(nodes: int, pub: str, s: float) -> dict[str, Any]:
        return {"nodes": nodes, "publisher": pub, "restart_s": s, "router_cpu_s": 1.0, "wire_bytes": 2_000_000,
                "kvshmd_cpu_s": 0.1 if pub == "kvshm" else None, "kvshmd_idle_cpu_per_s": 0.01}
    c = {"seed": 18, "scale": [row(8, "kvshm", 0.5), row(8, "vllm", 1.0), row(64, "kvshm", 6.0),
                               row(64, "vllm", 3.0), {"nodes": 32, "publisher": "kvshm", "error": "timeout"}]}
    lines = rr.cluster_section(c, "x.json")
    body = [ln for ln in lines if ln.startswith("| 8 ") or ln.startswith("| 64 ")]
    assert len(body) == 2 and "| 0.50× |" in body[0] and body[0].endswith("| info |")
    assert "| 2.00× |" in body[1] and "MISS" in body[1]
    assert rr.cluster_section({"scale": []}, "x.json") == []


def dynamo_run(kv_engine_s: float, kv_worker_s: float, kvshmd_s: float) -> dict[str, Any]:
    def side(engine_s: float, worker_s: float, kvshmd: float) -> dict[str, Any]:
        return {"requests": 100, "engine_core_cpu_s": engine_s, "worker_cpu_s": worker_s, "kvshmd_cpu_s": kvshmd,
                "engine_batches": 80, "batches": 90, "wall_s": 60.0, "failed": 0, "per_round": []}
    return {"rounds": 4, "requests": 25, "warmup": 8, "pause_s": 0.1, "seconds": 600.0, "loadavg": [3.0, 4.0],
            "cores": 2, "sides": {"vLLM zmq": side(1.0, 2.0, 0.0), "kvshm shared": side(kv_engine_s, kv_worker_s,
                                                                                       kvshmd_s)}}


@pytest.mark.parametrize(("kv_engine_s", "kv_worker_s", "kvshmd_s", "verdict"), [
    (0.8, 2.0, 0.1, "PASS"),  # engine core 0.80x, node 2.9/3.0
    (0.8, 2.0, 0.3, "MISS"),  # engine core cheaper, but the node 3.1/3.0
    (1.1, 1.8, 0.0, "MISS"),  # the node cheaper, the engine core not
])
def test_dynamo_figures_are_per_request_against_the_same_run_control(kv_engine_s: float, kv_worker_s: float,
                                                                      kvshmd_s: float, verdict: str) -> None:
    import dynamo_bench

    r = dynamo_run(kv_engine_s, kv_worker_s, kvshmd_s)
    f = dynamo_bench.figures(r)
    assert f["vLLM zmq"]["engine"] == pytest.approx(10.0)  # 1 s over 100 requests: 10 ms each
    assert f["vLLM zmq"]["node"] == pytest.approx(30.0)
    assert f["vLLM zmq"]["engine_per_batch"] == pytest.approx(12_500.0)  # 1 s over 80 engine batches, in µs
    kv = f["kvshm shared"]
    assert kv["ratio_engine"] == pytest.approx(kv_engine_s / 1.0)
    assert kv["ratio_node"] == pytest.approx((kv_engine_s + kv_worker_s + kvshmd_s) / 3.0)
    # the control's engine core minus kvshm's, per engine batch the control published
    assert kv["saved_per_batch"] == pytest.approx(1e6 * (1.0 - kv_engine_s) / 80)
    assert "ratio_engine" not in f["vLLM zmq"]
    text = dynamo_bench.report(r)
    assert f"node **{kv['ratio_node']:.2f}×** (goal ≤ 1): {verdict}" in text
    assert ("saved" if kv_engine_s < 1.0 else "added") + " per published batch" in text
    assert "| requests / engine batches / all batches | 100 / 80 / 90 | 100 / 80 / 90 |" in text
    assert "load average 3.0 / 4.0" in text
    assert "the resolution of this run" not in text  # one kvshm side: no second one to compare with
    r["sides"]["kvshm private"] = {**r["sides"]["kvshm shared"], "engine_core_cpu_s": kv_engine_s + 0.1}
    assert "yet differ by 1.00 ms per request (1250 µs per batch)" in dynamo_bench.report(r)
    r["sides"]["no publisher"] = {**r["sides"]["vLLM zmq"], "engine_core_cpu_s": 0.9, "engine_batches": 0}
    text = dynamo_bench.report(r)
    assert "| engine core CPU per engine batch | 12500.00 µs |" in text and " | — |" in text
    assert "- no publisher / vLLM zmq: engine core 0.90× (vLLM's publisher costs its engine core 1250 µs" in text
    assert "off the engine core's main thread" not in text  # no main-thread figure in this measurement
    r["sides"]["vLLM zmq"]["engine_main_cpu_s"] = 0.7  # other threads: 0.3 s over 100 requests
    r["sides"]["kvshm shared"]["engine_main_cpu_s"] = kv_engine_s - 0.1  # other threads: 0.1 s
    want = 1e6 * (0.3 - 0.1) / 80  # per batch the control published
    assert f"(where vLLM's publisher thread runs): {want:.0f} µs saved" in dynamo_bench.report(r)


def test_dynamo_section_is_spliced_after_sglang_and_replaced_in_place() -> None:
    import dynamo_bench

    base = "# r\n\n## SGLang: x\n\nsg\n\n## Queries\n\nq\n"
    sec = dynamo_bench.section(dynamo_run(0.8, 2.0, 0.1), "m.json")
    once = rr.splice(base, sec, "## SGLang")
    lines = once.splitlines()
    assert lines.index(sec[0]) > lines.index("sg") and lines.index(sec[0]) < lines.index("## Queries")
    again = rr.splice(once, dynamo_bench.section(dynamo_run(0.9, 2.0, 0.1), "m.json"), "## SGLang")
    assert again.count(sec[0]) == 1 and "0.90×" in again and "0.80×" not in again
    assert again.endswith("## Queries\n\nq\n")


def test_dynamo_saved_per_batch_has_the_standard_error_of_the_paired_rounds() -> None:
    import dynamo_bench

    r = dynamo_run(0.8, 2.0, 0.1)
    rnd = {"requests": 50, "engine_batches": 40}
    # the control's rounds: 0.5 s each; kvshm's 0.4 and 0.4: paired differences 2 ms and 2 ms per request (se 0),
    # then 0.5 and 0.3: 0 and 4 ms (mean 2, stdev 2.83, se 2)
    r["sides"]["vLLM zmq"]["per_round"] = [{**rnd, "engine_core_cpu_s": 0.5}, {**rnd, "engine_core_cpu_s": 0.5}]
    r["sides"]["kvshm shared"]["per_round"] = [{**rnd, "engine_core_cpu_s": 0.4}, {**rnd, "engine_core_cpu_s": 0.4}]
    assert dynamo_bench.figures(r)["kvshm shared"]["saved_se_per_batch"] == pytest.approx(0.0)
    r["sides"]["kvshm shared"]["per_round"] = [{**rnd, "engine_core_cpu_s": 0.5}, {**rnd, "engine_core_cpu_s": 0.3}]
    se = dynamo_bench.figures(r)["kvshm shared"]["saved_se_per_batch"]
    assert se == pytest.approx(2.0 * 1e3 * 100 / 80)  # 2 ms per request, in µs per batch (100 requests, 80 batches)
    assert f"± {se:.0f} µs (standard error" in dynamo_bench.report(r)
