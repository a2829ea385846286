"""The trace format: round trips, verbatim answers, u64 hashes."""

from __future__ import annotations

import json

from kvshm_conf.ops import Cleared, Header, Query, Removed, Stored, Trace, dump_trace, load_trace, op_json


def test_round_trip() -> None:
    t = Trace(Header("t", 3, 4, 10, {"D1": 2}))
    t.ops += [
        Stored(0, 1, (1, 2, 3, 4), (5,), None, "lora", True),
        Removed(1, 0, (5, 6)),
        Cleared(2, 1),
        Query(None, 2, '{"Error":"x"}'),
    ]
    back = load_trace(dump_trace(t).splitlines())
    assert back.header == t.header
    assert back.ops == t.ops


def test_answer_spliced_verbatim() -> None:
    body = '{"TooNew":{"requested_start":5,"requested_end":5,"newest_available":4}}'
    line = op_json(Query(5, 5, body))
    assert line.endswith(',"answer":' + body + "}")
    assert json.loads(line)["answer"] == json.loads(body)


def test_negative_hashes_are_u64() -> None:
    d = json.loads(op_json(Stored(0, 0, (1,), (-1,), -2)))
    assert d["hashes"] == [2**64 - 1]
    assert d["parent"] == 2**64 - 2


def test_header_without_deviations_omits_them() -> None:
    first = dump_trace(Trace(Header("t", 1, 2, 3))).splitlines()[0]
    assert json.loads(first) == {"trace": "t", "worker_id": 1, "block_size": 2, "max_buffer_size": 3}
