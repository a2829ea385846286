"""The classification of a pair of answers: it can say identical, same state, a deviation, and FAIL."""

from __future__ import annotations

import json

from kvshm_conf.differential import classify, feed
from kvshm_conf.gen import Profile, Stream
from kvshm_conf.ops import Event, Op, Query, Stored
from kvshm_conf.rebuild import filter_rank

import kvshm_conformance as ref

P = Profile("unit", ranks=(0, 1), block_size=2)
EVENTS: list[Event] = [
    Stored(0, 0, (1, 2, 3, 4), (101, 102)),
    Stored(1, 1, (5, 6), (201,)),
    Stored(2, 0, (7, 8), (103,), 102),
]


def answers(q: Query) -> str:
    ix = ref.LocalIndexer(P.worker_id, P.block_size, P.max_buffer_size)
    for ev in EVENTS:
        assert feed(ix, ev) is None
    body = ix.get_events_json(q.start, q.end)
    ix.shutdown()
    return body


def stream(marks: dict[str, int]) -> Stream:
    ops: list[Op] = [*EVENTS, Query(None, None)]
    return Stream(P, 0, ops, marks)


def test_identical() -> None:
    q = Query(None, None)
    body = answers(q)
    assert classify(stream({}), 3, q, EVENTS, body, body) == ("identical", "")


def test_same_state_when_only_bytes_differ() -> None:
    q = Query(None, None)
    body = answers(q)
    spaced = json.dumps(json.loads(body), indent=1)
    assert classify(stream({}), 3, q, EVENTS, spaced, body) == ("same-state", "")


def test_events_vs_dump_of_the_same_state() -> None:
    q = Query(0, 2)
    events = answers(q)
    dump = answers(Query(None, None))
    assert next(iter(json.loads(events))) == "Events"
    # From an empty consumer, all events and the dump rebuild the same tree and watermark.
    assert classify(stream({}), 3, q, EVENTS, dump, events)[0] == "same-state"


def test_fail_and_deviation() -> None:
    q = Query(None, None)
    body = answers(q)
    doc = json.loads(body)
    doc["TreeDump"]["events"] = doc["TreeDump"]["events"][:1]
    short = json.dumps(doc, separators=(",", ":"))
    outcome, detail = classify(stream({}), 3, q, EVENTS, short, body)
    assert outcome == "FAIL" and "rebuilt states differ" in detail
    assert classify(stream({"D1": 1}), 3, q, EVENTS, short, body)[0] == "D1"
    assert classify(stream({"D1": 4}), 3, q, EVENTS, short, body)[0] == "FAIL"  # marked after the query


def test_unparseable_answer_fails() -> None:
    q = Query(None, None)
    outcome, detail = classify(stream({}), 3, q, EVENTS, '{"Nope":1}', answers(q))
    assert outcome == "FAIL" and "does not parse" in detail


def test_filter_rank() -> None:
    body = answers(Query(None, None))
    for r in (0, 1):
        evs = json.loads(filter_rank(body, r))["TreeDump"]["events"]
        assert evs and all(e["event"]["dp_rank"] == r for e in evs)
    assert filter_rank('{"Error":"x"}', 0) == '{"Error":"x"}'
