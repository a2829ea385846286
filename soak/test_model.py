"""Tests of the soak's judge: the seeded streams replay exactly, and a consumer's wrong state is caught.

Run: ``.venv/bin/python -m pytest soak/test_model.py`` (``make soak-short`` runs it first).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
from model import AnswerError, Event, StreamGen, Tree, Truth, consume  # noqa: E402


def _router_event(w: int, ev: Event) -> dict[str, object]:
    if ev.kind == "stored":
        data: object = {"stored": {"parent_hash": ev.parent, "start_position": None,
                                   "blocks": [{"block_hash": h, "tokens_hash": 1, "mm_extra_info": None}
                                              for h in ev.hashes]}}
    elif ev.kind == "removed":
        data = {"removed": {"block_hashes": list(ev.hashes)}}
    else:
        data = "cleared"
    return {"worker_id": w, "storage_tier": "device", "event": {"event_id": ev.seq, "data": data, "dp_rank": 0}}


def _dump(w: int, tree: Tree) -> str:
    """A TreeDump of ``tree`` as single-block Stored events, parents first."""
    events, done = [], set()

    def emit(h: int) -> None:
        if h in done:
            return
        p = tree.blocks[h]
        if p is not None:
            emit(p)
        done.add(h)
        events.append(_router_event(w, Event("stored", tree.last or 0, (h,), p)))

    for h in tree.blocks:
        emit(h)
    return json.dumps({"TreeDump": {"events": events, "last_event_id": tree.last}})


def test_stream_replays_exactly() -> None:
    a, b = StreamGen(7, 3, 0, 4), StreamGen(7, 3, 0, 4)
    for _ in range(3000):
        assert a.next() == b.next()
    assert StreamGen(7, 3, 1, 4).next() != StreamGen(7, 3, 0, 4).next()


@pytest.mark.parametrize("seed", range(5))
def test_truth_matches_stream_model(seed: int) -> None:
    """The judge's truth (tokens dropped) and a tree fed the producer's events agree at every id."""
    gen, t = StreamGen(seed, 1, 0, 4), Truth(StreamGen(seed, 1, 0, 4))
    tree = Tree()
    t.advance(2000)
    for ev in (gen.next() for _ in range(2000)):
        tree.apply(ev)
        assert t.at(ev.seq).blocks == tree.blocks
    assert t.at(t.events[10].seq).blocks != tree.blocks or not tree.blocks


def test_stream_keeps_to_engine_rules() -> None:
    """Removed names held leaves only (plus unknown hashes): a Removed never orphans a held block."""
    t = Truth(StreamGen(11, 1, 0, 4))
    t.advance(5000)
    tree = Tree()
    for ev in t.events:
        tree.apply(ev)
        for h, p in tree.blocks.items():
            assert p is None or p in tree.blocks, f"block {h} orphaned after event {ev.seq}"


def test_consume_detects_wrong_state() -> None:
    t = Truth(StreamGen(3, 5, 0, 4))
    t.advance(500)
    truth = t.at(t.last_seq).copy()
    variant, got = consume(Tree(), _dump(5, truth), 5)
    assert variant == "TreeDump" and truth.diff(got) == ""
    parents = set(truth.blocks.values())
    one = next(h for h in truth.blocks if h not in parents)  # a leaf
    wrong = truth.copy()
    del wrong.blocks[one]
    _, got = consume(Tree(), _dump(5, wrong), 5)
    assert "1 missing" in truth.diff(got)


def test_consume_events_onto_state_and_refusals() -> None:
    t = Truth(StreamGen(4, 9, 0, 4))
    t.advance(300)
    mid = t.events[150].seq
    state = t.at(mid).copy()
    body = json.dumps({"Events": {"events": [_router_event(9, e) for e in t.events[151:]],
                                  "last_event_id": t.last_seq}})
    _, got = consume(state, body, 9)
    assert t.at(t.last_seq).diff(got) == ""
    assert consume(state, '{"TooNew":{"requested_start":1,"requested_end":2,"newest_available":0}}', 9)[1] is state
    with pytest.raises(AnswerError):
        consume(state, body.replace('"worker_id": 9', '"worker_id": 8', 1), 9)
    with pytest.raises(AnswerError):
        consume(state, '{"Events":1,"TreeDump":2}', 9)
