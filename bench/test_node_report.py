"""Tests of the node section (node_report.py): each goal is a ratio or a figure against its same-run
baseline, PASS exactly at the limit, skipped (never PASS) when a side was not measured, and a MISS names its
figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_report as nr  # noqa: E402
from _report import Goal  # noqa: E402


def s(median: float, p99: float | None = None, n: int = 10) -> dict[str, float]:
    return {"n": n, "median_us": median, "p99_us": p99 or median, "mean_us": median}


def threaded(a: float | None, c_engine: float, c_daemon: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"headline/c": {"engine_cpu_us": c_engine, "daemon_cpu_us": c_daemon,
                                          "latency": s(200.0, 900.0, 1000)}}
    if a is not None:
        out["headline/a"] = {"engine_cpu_us": a, "engine_cpu_pct": a / 10, "latency": s(100.0, 200.0, 1000)}
    return out


def results(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "machine": {"cores": 2},
        "config": {"worker_low_rate": 10.0},
        "zmq": {"rate": 1000.0, "threaded": threaded(100.0, 20.0, 40.0), "node": {"100": threaded(200.0, 50.0, 70.0)},
                "inline": {"summary": {"headline/a": s(30.0), "headline/c": s(9.0)}}},
        "workers": {"rate": 400.0, "points": [
            {"workers": 1, "rate": 400.0, "queries": True, "query": s(300.0, 800.0), "daemon_cpu_pct": 5.0},
            {"workers": 64, "rate": 400.0, "queries": True, "query": s(900.0, 4000.0), "daemon_cpu_pct": 60.0,
             "machine_busy_pct": 50.0},
            {"workers": 64, "rate": 10.0, "queries": False, "daemon_cpu_pct": 1.5, "empty_daemon_cpu_pct": 0.05},
            {"workers": 64, "rate": 0.0, "queries": False, "daemon_cpu_pct": 0.15, "empty_daemon_cpu_pct": 0.05}]},
        "publish": {"summary": {"stored/32/kvshm": s(7.0), "stored/32/floor": s(6.0)}},
        "queries": {"blocks": 100_000, "summary": {"events10/kvshm": s(30.0), "events10/ref": s(20.0),
                                                   "dump_fresh/kvshm": s(7000.0), "dump_fresh/ref": s(7500.0)}},
        "scale": {"points": [{"blocks": n, "bytes_per_block_kvshm": 250.0, "bytes_per_block_ref": 260.0,
                              "go_memstats_heap_alloc_bytes": 150.0 * n} for n in (100_000, 1_000_000)]},
    }
    d.update(over)
    return d


def goal(d: dict[str, Any], start: str) -> Goal:
    (g,) = [g for g in nr.node_goals(d, 96.0) if g.name.startswith(start)]
    return g


def test_node_cpu_is_engine_plus_kvshmd_over_the_reference_engine_at_each_rate() -> None:
    gs = [g for g in nr.node_goals(results()) if g.name.startswith("node CPU")]
    assert [g.name.endswith(r) for g, r in zip(gs, ("100 batches/s", "1,000 batches/s"), strict=True)]
    assert [g.ratio for g in gs] == [pytest.approx(120 / 200), pytest.approx(60 / 100)]
    assert all(g.ok for g in gs)  # exactly 0.6x: met
    d = results()
    d["zmq"]["threaded"]["headline/c"]["daemon_cpu_us"] = 40.5
    g = [g for g in nr.node_goals(d) if g.name.startswith("node CPU")][1]
    assert g.ok is False and "kvshmd spends 40.50 µs of the node's 60.50 µs" in g.limit
    d["zmq"]["threaded"] = threaded(None, 20.0, 40.0)  # no reference: skipped, never PASS
    assert [g for g in nr.node_goals(d) if g.name.startswith("node CPU")][1].ok is None


def test_node_cpu_miss_names_the_wake_floor_of_its_rate() -> None:
    d = results()
    d["zmq"]["threaded"]["headline/c"]["daemon_cpu_us"] = 50.0
    g = [g for g in nr.node_goals(d, None, {1000.0: 25.0, 100.0: 90.0}) if g.name.startswith("node CPU")][1]
    assert g.ok is False
    assert "is 25.00 µs of CPU per wakeup; kvshmd's 50.00 µs per batch is 2.0× that floor" in g.limit
    assert "engine + floor alone would be 0.45× the reference" in g.limit
    g = [g for g in nr.node_goals(d) if g.name.startswith("node CPU")][1]
    assert "floor" not in g.limit  # not measured: not claimed


@pytest.mark.parametrize(("idle", "low", "ok_idle", "ok_low"),
                         [(0.2, 2.0, True, True), (0.21, 2.01, False, False)])
def test_stream_cpu_goals_are_percent_of_a_core_with_the_empty_daemon_as_baseline(
        idle: float, low: float, ok_idle: bool, ok_low: bool) -> None:
    d = results()
    d["workers"]["points"][3]["daemon_cpu_pct"] = idle
    d["workers"]["points"][2]["daemon_cpu_pct"] = low
    gi, gl = goal(d, "kvshmd CPU, 64 attached idle"), goal(d, "kvshmd CPU, 64 streams at 10")
    assert (gi.ok, gl.ok) == (ok_idle, ok_low)
    assert "nothing attached: 0.05%" in gi.baseline
    assert "per stream per second" in gl.limit and "µs per event" in gl.limit
    del d["workers"]["points"][3]
    assert goal(d, "kvshmd CPU, 64 attached idle").ok is None


@pytest.mark.parametrize(("p50", "p99", "ok"), [(1000.0, 5000.0, True), (1001.0, 10.0, False),
                                                (10.0, 5001.0, False)])
def test_query_goal_needs_both_p50_and_p99(p50: float, p99: float, ok: bool) -> None:
    d = results()
    d["workers"]["points"][1]["query"] = s(p50, p99)
    g = goal(d, "recovery query")
    assert g.ok is ok and g.ratio == pytest.approx(p50 / 300.0)
    assert "1 stream: p50 300 µs" in g.baseline


def test_apply_goals_compare_todays_same_run_ratio() -> None:
    d = results()
    today = nr.TODAY_STORED_VS_FLOOR
    d["publish"]["summary"]["stored/32/kvshm"] = s(6.0 * today * 1.099)  # just under +10% over today's ratio
    assert goal(d, "engine: `apply_stored`").ok is True
    d["publish"]["summary"]["stored/32/kvshm"] = s(6.0 * today * 1.11)
    assert goal(d, "engine: `apply_stored`").ok is False
    assert goal(d, "engine: `apply_batch`").ratio == pytest.approx(0.3 / nr.TODAY_BATCH_VS_A)


def test_memory_rows_for_every_size_and_a_missing_one_is_skipped() -> None:
    gs = [g for g in nr.node_goals(results(), 96.0) if g.name.startswith("kvshmd RssAnon")]
    assert [g.ok for g in gs] == [True, True, None]  # 10 M not measured in this run
    d = results()
    d["scale"]["points"][0]["bytes_per_block_kvshm"] = 261.0
    g = goal(d, "kvshmd RssAnon per resident block, 100,000")
    assert g.ok is False and "Go heap_alloc 150 B/block" in g.limit and "96 B/block" in g.limit


def test_section_lists_every_miss_with_its_figures() -> None:
    d = results()
    d["queries"]["summary"]["events10/kvshm"] = s(31.0)
    text = "\n".join(nr.node_section(d))
    assert "## Node" in text
    assert text.count("**MISS**") == 1 and "* `get_events_json`, 10 recent events: kvshm is 11.00 µs slower" in text
    assert nr.node_section({}) == []


def test_proc_cpu_counts_every_thread_finer_than_a_clock_tick() -> None:
    """kvshmd's CPU comes from its live threads' schedstat (ns): never more than getrusage (every thread, exited
    ones included) and not a multiple of /proc/PID/stat's 10 ms tick."""
    import os
    import threading

    import _common

    def burn() -> None:
        x = 0
        for i in range(300_000):
            x += i

    t = threading.Thread(target=burn)
    t.start()
    burn()
    t.join()  # the thread exited: its time is in getrusage, not in the live threads' schedstat
    live = _common.proc_cpu_s(os.getpid())
    assert 0 < live <= _common.cpu_self() + 0.01
    assert round(live * 1e9) % 10_000_000 != 0
