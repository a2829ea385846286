"""The harness's own logic (no engine): the wire check, the event application, the table's goals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvshm_e2e import truth
from kvshm_e2e.judges import Router, WireRecord, _apply
from kvshm_e2e.table import MODES, Check, Judged, Row, failures, render


@pytest.mark.parametrize(
    ("seqs", "reused"),
    [
        ([("e1", 0), ("e1", 1), ("e2", 2)], 0),
        ([("e1", 0), ("e1", 1), ("e2", 0), ("e2", 1), ("e2", 2)], 2),  # vLLM: seqs restart at 0
        ([("e1", 5), ("k2", 5)], 1),  # a restarted kvshmd must not publish the last seq again
        ([("e1", 1_000), ("e2", 2_000_000)], 0),  # a jump up is fine (Dynamo replays the gap)
    ],
)
def test_wire_reused(seqs: list[tuple[str, int]], reused: int) -> None:
    assert len(WireRecord(seqs).reused()) == reused


def test_apply_events() -> None:
    hashes: set[int] = set()
    _apply(hashes, {"stored": {"blocks": [{"block_hash": 1}, {"block_hash": 2}], "parent_hash": None}})
    _apply(hashes, {"removed": {"block_hashes": [1]}})
    assert hashes == {2}
    _apply(hashes, "cleared")
    assert hashes == set()
    _apply(hashes, {"stored": {"blocks": [{"block_hash": 3}]}})
    _apply(hashes, {"cleared": None})
    assert hashes == set()


def test_truth_read(tmp_path: Path) -> None:
    p = tmp_path / "truth.json"
    assert truth.read(p) == truth.EMPTY
    p.write_text(json.dumps({"pid": 1, "step": 4, "hashes": [5, 6]}))
    assert truth.read(p) == truth.Truth(frozenset({5, 6}), 4)


def test_failures_judge_only_kvshm() -> None:
    control, shared, _ = MODES
    wrong = Judged(59, 60)
    rows = [
        Row("restart", control, 60, wrong, None, None),
        Row("restart", shared, 60, Judged(0, 0), Judged(0, 0, "incomplete"), None),
        Row("steady", shared, 60, Judged(0, 0), Judged(0, 0), 0.5),
    ]
    checks = [Check("no seq reused", control, False, "x"), Check("no seq reused", shared, True, "ok")]
    assert failures(rows, checks) == ["restart / kvshm shared"]
    text = render(rows, checks)
    assert "+59 -60" in text and "exact (incomplete)" in text and "> 10 s" in text


def test_truth_plugin_hashes_as_published(tmp_path: Path) -> None:
    """The plugin's ints are vLLM's own conversion of the pool's keys (the hash bytes + a 4-byte group id)."""
    from types import SimpleNamespace

    import kvshm_e2e_truth
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    raw = [bytes(range(i, i + 32)) for i in (0, 7)]
    keys = {h + (0).to_bytes(4, "big"): None for h in raw}
    pool = SimpleNamespace(cached_block_hash_to_block=SimpleNamespace(_cache=keys))
    scheduler = SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=pool))
    got = kvshm_e2e_truth._hashes(scheduler)
    assert sorted(got, key=str) == sorted((maybe_convert_block_hash(h) for h in raw), key=str)
    path = tmp_path / "truth.json"
    kvshm_e2e_truth.write(str(path), 3, got)
    assert truth.read(path).hashes == frozenset(int(h) for h in got)


def test_router_warnings_once(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    log.write_text("INFO x: started\nWARN l: Gap detected: expected seq 0, got 100 worker_id=7\n"
                   "WARN l: Gap detected: expected seq 0, got 100 self.worker_id=7 got=100\n")
    r = Router(tmp_path / "standalone", 1, log)
    assert r.warnings() == ["WARN l: Gap detected: expected seq 0, got 100"]
    assert r.warnings() == []
    with log.open("a") as f:
        f.write("ERROR l: boom\n")
    assert r.warnings() == ["ERROR l: boom"]
