"""The Python surface of kvshm_conformance (argument handling the Rust tests cannot reach).

Run against the installed wheel: pytest conformance/tests/test_module.py
"""

from __future__ import annotations

import json

import pytest

import kvshm_conformance as k


class Idx:
    """An int-like that is not an int (what numpy integer scalars are to PyO3)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def blocks(body: str) -> list[tuple[int, int]]:
    [(variant, inner)] = json.loads(body).items()
    return [
        (b["block_hash"], b["tokens_hash"])
        for e in inner["events"]
        for b in e["event"]["data"]["stored"]["blocks"]
    ]


def test_apply_stored_takes_ints_negatives_and_int_likes() -> None:
    ix = k.LocalIndexer(7, 4)
    ix.apply_stored(0, [0, 1, 2, 3], [-1])
    ix.apply_stored(1, (Idx(t) for t in range(4, 8)), [Idx(2**64 - 2)], parent_hash=Idx(-1))
    ix.apply_stored(2, range(8, 12), [5], parent_hash=2**64 - 2, dp_rank=0, lora_name=None, is_eagle=False)
    assert blocks(ix.get_events_json(0, None)) == [
        (2**64 - 1, 9143094415614847814),  # tokens 0..3, seed 1337
        (2**64 - 2, blocks(ix.get_events_json(1, 1))[0][1]),
        (5, blocks(ix.get_events_json(2, 2))[0][1]),
    ]
    ix.apply_removed(3, [Idx(5)])
    ix.apply_cleared(4)
    assert json.loads(ix.get_events_json())["TreeDump"]["last_event_id"] == 4
    ix.shutdown()


@pytest.mark.parametrize("bad", ["ab", b"ab", {5: 1}, 5, None, [1.5], [2**64], [-(2**63) - 1]])
def test_hash_lists_refuse_non_int_sequences(bad: object) -> None:
    ix = k.LocalIndexer(7, 4)
    with pytest.raises((TypeError, OverflowError)):
        ix.apply_removed(0, bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, OverflowError)):
        ix.apply_stored(0, [0, 1, 2, 3], bad)  # type: ignore[arg-type]
    ix.shutdown()


def test_token_mismatch_is_zipped_not_raised() -> None:
    ix = k.LocalIndexer(7, 4)
    ix.apply_stored(0, [0, 1, 2, 3, 4], [1, 2])  # one full window, two hashes
    ix.apply_stored(1, [], [3])  # no window
    assert [h for h, _ in blocks(ix.get_events_json(0, None))] == [1]
    ix.shutdown()


def test_block_size_zero_and_shutdown() -> None:
    with pytest.raises(RuntimeError):
        k.LocalIndexer(7, 0)
    ix = k.LocalIndexer(7, 4, max_buffer_size=3)
    ix.shutdown()
    ix.shutdown()


def test_consumer_round_trip() -> None:
    ix = k.LocalIndexer(7, 2)
    live = k.Consumer(2)
    ops = [
        {"op": "stored", "seq": 0, "dp_rank": 0, "tokens": [1, 2, 3, 4], "hashes": [10, 11], "parent": None},
        {"op": "removed", "seq": 1, "dp_rank": 0, "hashes": [11]},
    ]
    ix.apply_stored(0, [1, 2, 3, 4], [10, 11])
    ix.apply_removed(1, [11])
    for op in ops:
        assert live.apply_live(9, 0, json.dumps(op)) in ("initial", "contiguous")
    rebuilt = k.Consumer()
    assert rebuilt.observe(9, 0, 1) == "initial"
    assert rebuilt.apply_recovery(9, 0, ix.get_events_json(0, 1)) == "Events"
    assert rebuilt.watermark(9, 0) == 1 and rebuilt.watermark(9, 1) is None
    assert rebuilt.state() == live.state()
    assert rebuilt.observe(9, 0, 1) == "stale" and rebuilt.observe(9, 0, 3) == "gap"
    [(w, r, score)] = rebuilt.find_matches([json.loads(rebuilt.state())["workers"][0]["blocks"][0][0][0]])
    assert (w, r, score) == (9, 0, 1)
    with pytest.raises(ValueError):
        rebuilt.apply_live(9, 0, json.dumps(ops[0]))  # no block size anywhere
    assert rebuilt.apply_live(9, 0, json.dumps(ops[0] | {"seq": 2}), kv_block_size=2) == "contiguous"
    with pytest.raises(ValueError):
        rebuilt.apply_live(9, 0, '{"op":"query","start":1,"end":2}', kv_block_size=2)
    with pytest.raises(ValueError):
        rebuilt.apply_recovery(9, 0, '{"Events":[]}')
    ix.shutdown()


def test_parse_response() -> None:
    body = k.LocalIndexer(7, 2).get_events_json()
    assert k.parse_response(body, "1.6.1") == body
    assert "reset_scope" not in k.parse_response(body, "b2b7868")
    for types in ("1.6.1", "b2b7868", "0.1"):
        with pytest.raises(ValueError):
            k.parse_response('{"Events":[]}', types)


def test_standalone_judge_surface() -> None:
    j = k.StandaloneJudge()
    assert j.state() == "{}"
    assert json.loads(j.dump_json()) == []
    with pytest.raises(ValueError):
        j.register(1, 0, "tcp://127.0.0.1:1", None, 0)
    j.register(1, 0, "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", 4)
    with pytest.raises(ValueError):
        j.register(1, 0, "tcp://127.0.0.1:1", None, 4)
    with pytest.raises(ValueError):
        j.pause(1, 7)
    [w] = json.loads(j.workers_json())
    assert (w["instance_id"], w["block_size"], w["endpoints"]) == (1, 4, {"0": "tcp://127.0.0.1:1"})
    j.pause(1, 0)
    assert json.loads(j.workers_json())[0]["listeners"]["0"]["status"] == "paused"
    j.resume(1, 0)
    assert j.find_matches([1, 2]) == []
    assert all(isinstance(level, str) and isinstance(f, dict) for level, _, f in j.log())
