"""The harness's parsers against the lines Dynamo 1.6.1 writes (copied from a run's logs and /metrics)."""

from __future__ import annotations

import random
from pathlib import Path

from kvshm_dynamo.judges import BatchRecorder, CacheView, Decision, last_decision, parse_applied
from kvshm_dynamo.scenarios import prompt

ROUTING = (
    "2026-12-06T05:47:36.213138Z DEBUG http-request:completions:completions_single:kv_router.select_worker: "
    "dynamo_llm::kv_router::routing_host::kv_selection: [ROUTING] Best: worker_{w} dp_rank=0 with {o}/5 blocks "
    "overlap request_id=a16d01f worker_id={w} dp_rank=0 overlap_blocks={o} total_blocks=5\n"
)


def test_last_decision() -> None:
    text = ROUTING.format(w=13471622916193781641, o=0) + "other line\n" + ROUTING.format(w=99, o=3)
    assert last_decision(text, {99: 2, 13471622916193781641: 1}) == (2, 3)
    assert last_decision(ROUTING.format(w=5, o=4), {}) == (0, 4), "an unknown instance id is worker 0"
    assert last_decision("no decision here\n", {}) == (0, -1)


def test_parse_applied() -> None:
    text = "\n".join([
        "# TYPE dynamo_component_kv_cache_events_applied counter",
        'dynamo_component_kv_cache_events_applied{event_type="stored",status="ok",worker="x"} 100',
        'dynamo_component_kv_cache_events_applied{event_type="removed",status="ok",worker="x"} 6',
        'dynamo_component_kv_cache_events_applied{event_type="removed",status="block_not_found"} 2',
        'dynamo_component_other{status="ok"} 9',
    ])
    assert parse_applied(text) == {"ok": 106, "block_not_found": 2}
    assert parse_applied("") == {}


def test_decision_right() -> None:
    assert Decision(1, 2, 2).right and not Decision(1, 2, 1).right and not Decision(1, 0, -1).right
    assert Decision(2, 3, 1).cell() == "w2:3/1"


def test_prompt_is_seeded() -> None:
    a, b = prompt(random.Random("step")), prompt(random.Random("step"))
    assert a == b and len(a) == 4 * 32 + 5 and all(3 <= t < 1024 for t in a)


def test_batch_recorder_counts(tmp_path: Path) -> None:
    """Kinds of batches, and the events as the relay hands them on (adjacent ones of a kind merged)."""
    import msgspec

    def batch(*tags: str) -> bytes:
        return msgspec.msgpack.encode([1.0, [{"type": t, "block_hashes": [1]} for t in tags], 0])

    rec = BatchRecorder(f"ipc://{tmp_path}/none.sock")
    try:
        rec.on_payload(batch("BlockRemoved", "BlockRemoved", "BlockStored"))
        rec.on_payload(batch("BlockStored"))
        rec.on_payload(batch())
        rec.on_payload(batch("AllBlocksCleared"))
        rec.on_payload(b"\xc1")  # not msgpack: ignored
    finally:
        rec.close()
    c = rec.count
    assert (c.engine, c.events, c.merged, c.empty, c.cleared, c.total) == (2, 4, 3, 1, 1, 4)
    assert rec.sizes == [3, 1]


def test_cache_view_overlap() -> None:
    """A prompt's overlap per worker from the stored and removed events: chained through parents, cut at the first
    block not held, emptied by AllBlocksCleared; a child of a parent never seen matches nothing."""
    view = CacheView(block_size=2)
    view.apply({"type": "BlockStored", "block_hashes": [b"a", b"b"], "parent_block_hash": None,
                "token_ids": [1, 2, 3, 4]})
    view.apply({"type": "BlockStored", "block_hashes": [b"c"], "parent_block_hash": b"b", "token_ids": [5, 6]})
    view.apply(["BlockStored", [b"x"], b"unseen", [7, 8], 2])  # vLLM's array form; its parent unknown here
    assert view.overlap([1, 2, 3, 4, 5, 6, 9]) == 3
    assert view.overlap([1, 2, 3, 9, 5, 6]) == 1, "a different second block: only the first matches"
    assert view.overlap([7, 8]) == 0 and view.overlap([1]) == 0
    view.apply({"type": "BlockRemoved", "block_hashes": [b"b"]})
    assert view.overlap([1, 2, 3, 4, 5, 6]) == 1, "the prefix stops at the removed block"
    view.apply({"type": "AllBlocksCleared"})
    assert view.overlap([1, 2, 3, 4]) == 0


def test_decision_tie() -> None:
    """A tie: both workers up with the same overlap; the overlaps do not make two decisions differ."""
    assert Decision(1, 2, 2, (2, 2)).tie and Decision(1, 0, 0, (0, 0)).tie
    assert not Decision(1, 2, 2, (2, 0)).tie and not Decision(1, 0, 0, (0, -1)).tie and not Decision(1, 0, 0).tie
    assert Decision(1, 2, 2, (2, 2)) == Decision(1, 2, 2, (2, 0)) and Decision(1, 2, 2, (2, 2)).cell() == "w1:2/2="


def test_batch_recorder_view_restarts_with_incarnation(tmp_path: Path) -> None:
    """A new incarnation's view starts empty, as the router's index of a restarted worker's new instance."""
    import msgspec

    stored = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                            "token_ids": list(range(32))}], 0])
    rec = BatchRecorder(f"ipc://{tmp_path}/none.sock")
    try:
        rec.on_payload(stored)
        assert rec.view.overlap(list(range(40))) == 1
        rec.incarnation("worker 2.2")
        assert rec.view.overlap(list(range(40))) == 0
    finally:
        rec.close()


def test_ties_table() -> None:
    """The tie table: the events' overlap against the router's (a down worker not compared), the ties, the
    decisions off the ties that went to the larger overlap, the overlaps equal to the control's."""
    from kvshm_dynamo.scenarios import Row
    from kvshm_dynamo.table import ties
    from kvshm_e2e.table import Mode

    ctl = [Decision(1, 0, 0, (0, 0)), Decision(1, 2, 2, (2, 0)), Decision(2, 2, -1, (2, -1))]
    got = [Decision(2, 0, 0, (0, 0)), Decision(2, 0, 0, (2, 0)), Decision(2, 2, -1, (2, -1))]

    class Run:
        mode = Mode("kvshm shared", "kvshm", "shared")
        rows = [Row("s", mode, got, ctl, {}, "", True, 0.0)]

    line = ties([Run()]).splitlines()[-1]  # type: ignore[list-item]
    assert line == "| kvshm shared | 2/2 | 1/3 | 0/1 | 2/3 |", line
