"""Bad arguments of every kind: each raises its exception before anything is written (the ring's tail word, read
from the file, does not move, and the daemon receives nothing)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvshm import LocalIndexer

from conftest import IndexerFactory
from helpers import daemon_stream, event_ids, query, ring_tail, toks

U64 = 1 << 64
BS = 4

Call = Callable[[LocalIndexer], Any]

BAD_CALLS: list[tuple[str, Call, type[Exception]]] = [
    # token/block counts that are not blocks x kv_block_size are published (test_count_mismatch_is_published)
    ("eagle not a bool", lambda ix: ix.apply_stored(0, toks(0, 9), [1, 2], is_eagle=1), TypeError),  # type: ignore[arg-type]
    ("eagle a string", lambda ix: ix.apply_stored(0, toks(0, 4), [1], is_eagle="no"), TypeError),  # type: ignore[arg-type]
    # token ids
    ("negative token", lambda ix: ix.apply_stored(0, [0, 1, -1, 3], [1]), ValueError),
    ("token >= 2**32", lambda ix: ix.apply_stored(0, [0, 1, 1 << 32, 3], [1]), ValueError),
    ("token a float", lambda ix: ix.apply_stored(0, [0, 1, 2.0, 3], [1]), TypeError),  # type: ignore[list-item]
    ("token a string", lambda ix: ix.apply_stored(0, [0, 1, "2", 3], [1]), TypeError),  # type: ignore[list-item]
    ("token None", lambda ix: ix.apply_stored(0, [0, 1, None, 3], [1]), TypeError),  # type: ignore[list-item]
    ("tokens None", lambda ix: ix.apply_stored(0, None, [1]), TypeError),  # type: ignore[arg-type]
    ("tokens a generator", lambda ix: ix.apply_stored(0, (t for t in toks(0, 4)), [1]), TypeError),  # type: ignore[arg-type]
    ("tokens an int", lambda ix: ix.apply_stored(0, 4, [1]), TypeError),  # type: ignore[arg-type]
    ("tokens bytes", lambda ix: ix.apply_stored(0, b"abcd", [1]), TypeError),
    ("tokens a str", lambda ix: ix.apply_stored(0, "abcd", [1]), TypeError),  # type: ignore[arg-type]
    ("tokens a dict", lambda ix: ix.apply_stored(0, {0: 1, 1: 1, 2: 1, 3: 1}, [1]), TypeError),  # type: ignore[arg-type]
    ("tokens a set", lambda ix: ix.apply_stored(0, {0, 1, 2, 3}, [1]), TypeError),  # type: ignore[arg-type]
    # block hashes
    ("hash >= 2**64", lambda ix: ix.apply_stored(0, toks(0, 4), [U64]), ValueError),
    ("hash < -2**63", lambda ix: ix.apply_stored(0, toks(0, 4), [-(1 << 63) - 1]), ValueError),
    ("hash a float", lambda ix: ix.apply_stored(0, toks(0, 4), [1.5]), TypeError),  # type: ignore[list-item]
    ("hash a string", lambda ix: ix.apply_stored(0, toks(0, 4), ["1"]), TypeError),  # type: ignore[list-item]
    ("hashes None", lambda ix: ix.apply_stored(0, [], None), TypeError),  # type: ignore[arg-type]
    # raw bytes and mappings would iterate as small ints (b"a" -> [97], {5: 1} -> [5]): never a list of hashes
    ("hashes bytes", lambda ix: ix.apply_stored(0, toks(0, 4), b"a"), TypeError),
    ("hashes bytearray", lambda ix: ix.apply_stored(0, toks(0, 4), bytearray(b"a")), TypeError),
    ("hashes a byte memoryview", lambda ix: ix.apply_stored(0, toks(0, 4), memoryview(b"a")), TypeError),
    ("hashes a str", lambda ix: ix.apply_stored(0, toks(0, 4), "5"), TypeError),  # type: ignore[arg-type]
    ("hashes a dict", lambda ix: ix.apply_stored(0, toks(0, 4), {5: 1}), TypeError),  # type: ignore[arg-type]
    ("hashes a set", lambda ix: ix.apply_stored(0, toks(0, 4), {5}), TypeError),  # type: ignore[arg-type]
    ("hashes a generator", lambda ix: ix.apply_stored(0, toks(0, 4), (h for h in [5])), TypeError),  # type: ignore[arg-type]
    ("hashes an iterator", lambda ix: ix.apply_stored(0, toks(0, 4), iter([5])), TypeError),  # type: ignore[arg-type]
    ("parent >= 2**64", lambda ix: ix.apply_stored(0, toks(0, 4), [1], parent_hash=U64), ValueError),
    ("parent < -2**63", lambda ix: ix.apply_stored(0, toks(0, 4), [1], parent_hash=-(1 << 63) - 1), ValueError),
    ("parent a string", lambda ix: ix.apply_stored(0, toks(0, 4), [1], parent_hash="1"), TypeError),  # type: ignore[arg-type]
    ("parent a float", lambda ix: ix.apply_stored(0, toks(0, 4), [1], parent_hash=1.0), TypeError),  # type: ignore[arg-type]
    # seq and dp_rank
    ("stored seq negative", lambda ix: ix.apply_stored(-1, toks(0, 4), [1]), ValueError),
    ("stored seq >= 2**64", lambda ix: ix.apply_stored(U64, toks(0, 4), [1]), ValueError),
    ("stored seq a string", lambda ix: ix.apply_stored("1", toks(0, 4), [1]), TypeError),  # type: ignore[arg-type]
    ("stored seq a float", lambda ix: ix.apply_stored(1.0, toks(0, 4), [1]), TypeError),  # type: ignore[arg-type]
    ("stored seq None", lambda ix: ix.apply_stored(None, toks(0, 4), [1]), TypeError),  # type: ignore[arg-type]
    ("stored dp_rank negative", lambda ix: ix.apply_stored(0, toks(0, 4), [1], dp_rank=-1), ValueError),
    ("stored dp_rank >= 2**32", lambda ix: ix.apply_stored(0, toks(0, 4), [1], dp_rank=1 << 32), ValueError),
    ("stored dp_rank a string", lambda ix: ix.apply_stored(0, toks(0, 4), [1], dp_rank="0"), TypeError),  # type: ignore[arg-type]
    # LoRA name
    ("lora bytes", lambda ix: ix.apply_stored(0, toks(0, 4), [1], lora_name=b"a"), TypeError),  # type: ignore[arg-type]
    ("lora an int", lambda ix: ix.apply_stored(0, toks(0, 4), [1], lora_name=5), TypeError),  # type: ignore[arg-type]
    ("lora not UTF-8", lambda ix: ix.apply_stored(0, toks(0, 4), [1], lora_name="\ud800"), ValueError),
    # removed
    ("removed hash >= 2**64", lambda ix: ix.apply_removed(0, [1, U64]), ValueError),
    ("removed hash < -2**63", lambda ix: ix.apply_removed(0, [-(1 << 63) - 1]), ValueError),
    ("removed hash a float", lambda ix: ix.apply_removed(0, [1.0]), TypeError),  # type: ignore[list-item]
    ("removed hashes None", lambda ix: ix.apply_removed(0, None), TypeError),  # type: ignore[arg-type]
    ("removed hashes bytes", lambda ix: ix.apply_removed(0, b"ab"), TypeError),
    ("removed hashes a dict", lambda ix: ix.apply_removed(0, {5: 1}), TypeError),  # type: ignore[arg-type]
    ("removed hashes a str", lambda ix: ix.apply_removed(0, "5"), TypeError),  # type: ignore[arg-type]
    ("removed seq negative", lambda ix: ix.apply_removed(-1, [1]), ValueError),
    ("removed seq a string", lambda ix: ix.apply_removed("0", [1]), TypeError),  # type: ignore[arg-type]
    ("removed dp_rank >= 2**32", lambda ix: ix.apply_removed(0, [1], dp_rank=1 << 32), ValueError),
    ("removed dp_rank a float", lambda ix: ix.apply_removed(0, [1], dp_rank=0.0), TypeError),  # type: ignore[arg-type]
    # cleared
    ("cleared seq >= 2**64", lambda ix: ix.apply_cleared(U64), ValueError),
    ("cleared seq negative", lambda ix: ix.apply_cleared(-5), ValueError),
    ("cleared seq a float", lambda ix: ix.apply_cleared(0.5), TypeError),  # type: ignore[arg-type]
    ("cleared dp_rank negative", lambda ix: ix.apply_cleared(0, dp_rank=-1), ValueError),
    ("cleared dp_rank a string", lambda ix: ix.apply_cleared(0, dp_rank="0"), TypeError),  # type: ignore[arg-type]
    # queries
    ("start negative", lambda ix: ix.get_events_json(-1), ValueError),
    ("start >= 2**64", lambda ix: ix.get_events_json(U64), ValueError),
    ("start a string", lambda ix: ix.get_events_json("1"), TypeError),  # type: ignore[arg-type]
    ("start a bool", lambda ix: ix.get_events_json(True), TypeError),
    ("end a float", lambda ix: ix.get_events_json(1, 2.0), TypeError),  # type: ignore[arg-type]
    ("end negative", lambda ix: ix.get_events_json(None, -2), ValueError),
]


@pytest.fixture(scope="module")
def shared_ix(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One indexer for the whole table (starting a daemon per row would only slow the suite down)."""
    ring_dir = tmp_path_factory.mktemp("rings")
    ix = LocalIndexer(8, BS, 100, ring_dir=ring_dir, ring_bytes=1 << 20)
    ix.apply_stored(0, toks(0, 4), [1])
    yield ix
    ix.shutdown()
    assert list(ring_dir.iterdir()) == []


@pytest.mark.parametrize(("name", "call", "exc"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_argument_writes_nothing(shared_ix: LocalIndexer, name: str, call: Call, exc: type[Exception]) -> None:
    before = ring_tail(shared_ix)
    published = shared_ix.stats()["published_events"]
    assert published is not None
    with pytest.raises(exc, match="kvshm|object of type|argument"):
        call(shared_ix)
    assert ring_tail(shared_ix) == before, f"{name}: the ring's tail moved"
    assert shared_ix.stats()["published_events"] == published


def test_nothing_reached_the_daemon(shared_ix: LocalIndexer) -> None:
    """After the whole table: the daemon saw only the valid events, and the next valid event is id 1."""
    for _, call, exc in BAD_CALLS:
        with pytest.raises(exc):
            call(shared_ix)
    shared_ix.apply_cleared(1)
    assert event_ids(query(shared_ix, 0)) == [0, 1]
    stream = daemon_stream(shared_ix.stats()["socket_path"], 8)
    assert stream["events_received"] == 2 and stream["malformed_events"] == 0 and stream["lost_events"] == 0


def test_accepted_edge_values(shared_ix: LocalIndexer) -> None:
    """The limits themselves are valid: u64/u32 maxima, i64 minimum, empty Stored and Removed, tuples, arrays."""
    from array import array

    ix = shared_ix
    base = ix.stats()["published_events"]
    assert base is not None
    ix.apply_stored(U64 - 1, [0, 1, 2, (1 << 32) - 1], [-(1 << 63)], parent_hash=U64 - 1, dp_rank=(1 << 32) - 1)
    ix.apply_stored(2, [], [])
    ix.apply_stored(3, tuple(toks(0, 4)), (5,), is_eagle=None, lora_name="")
    ix.apply_stored(4, array("I", toks(0, 9)), array("q", [-1, -2]), is_eagle=True)
    ix.apply_removed(5, [])
    ix.apply_removed(6, (U64 - 1, -(1 << 63)))
    ix.apply_stored(7, toks(0, 4), [9], dp_rank=None)  # None: the indexer's rank (0 here)
    ix.apply_removed(8, range(3), dp_rank=None)
    ix.apply_cleared(9, dp_rank=None)
    ix.apply_stored(10, toks(0, 4), memoryview(array("Q", [7])))  # a typed memoryview is a list of ids
    assert ix.stats()["published_events"] == base + 10


# Token counts that are not blocks x kv_block_size (4 here): published as given, never refused (publishers swallow
# exceptions, so a refusal would make the event vanish); kvshmd hashes the complete windows, zips them with the
# hashes and counts the event (tests/test_e2e.py checks the daemon's side).
COUNT_MISMATCHES: list[tuple[str, list[int], list[int], bool | None]] = [
    ("too few tokens", toks(0, 7), [1, 2], None),
    ("too many tokens", toks(0, 9), [1, 2], None),
    ("tokens without blocks", toks(0, 4), [], None),
    ("blocks without tokens", [], [1, 2], None),
    ("eagle without the extra token", toks(0, 8), [1, 2], True),
    ("extra token without eagle", toks(0, 9), [1, 2], False),
]


@pytest.mark.parametrize(("name", "tokens", "hashes", "eagle"), COUNT_MISMATCHES, ids=[c[0] for c in COUNT_MISMATCHES])
def test_count_mismatch_is_published(
    shared_ix: LocalIndexer, name: str, tokens: list[int], hashes: list[int], eagle: bool | None
) -> None:
    before = ring_tail(shared_ix)
    published = shared_ix.stats()["published_events"]
    assert published is not None
    shared_ix.apply_stored(0, tokens, hashes, is_eagle=eagle)
    assert ring_tail(shared_ix) > before, f"{name}: nothing was written"
    assert shared_ix.stats()["published_events"] == published + 1


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"worker_id": -1, "kv_block_size": 4}, ValueError),
        ({"worker_id": U64, "kv_block_size": 4}, ValueError),
        ({"worker_id": "0", "kv_block_size": 4}, TypeError),
        ({"worker_id": 0, "kv_block_size": 0}, ValueError),
        ({"worker_id": 0, "kv_block_size": -4}, ValueError),
        ({"worker_id": 0, "kv_block_size": 1 << 32}, ValueError),
        ({"worker_id": 0, "kv_block_size": 4.0}, TypeError),
        ({"worker_id": 0, "kv_block_size": True}, TypeError),
        ({"worker_id": 0, "kv_block_size": 4, "max_buffer_size": -1}, ValueError),
        ({"worker_id": 0, "kv_block_size": 4, "max_buffer_size": None}, TypeError),
        ({"worker_id": 0, "kv_block_size": 4, "ring_bytes": 100000}, ValueError),  # not a power of two
        ({"worker_id": 0, "kv_block_size": 4, "ring_bytes": 1 << 10}, ValueError),  # below 64 KiB
        ({"worker_id": 0, "kv_block_size": 4, "ring_bytes": "1M"}, TypeError),
        ({"worker_id": 0, "kv_block_size": 4, "dp_rank": -1}, ValueError),
        ({"worker_id": 0, "kv_block_size": 4, "dp_rank": 1 << 32}, ValueError),
        ({"worker_id": 0, "kv_block_size": 4, "dp_rank": "1"}, TypeError),
        ({"worker_id": 0, "kv_block_size": 4, "dp_rank": True}, TypeError),
        ({"worker_id": 0, "kv_block_size": 4, "dp_rank": 1.0}, TypeError),
    ],
)
def test_bad_constructor_arguments(ring_dir: Path, kwargs: dict[str, Any], exc: type[Exception]) -> None:
    kwargs.setdefault("ring_dir", ring_dir)
    with pytest.raises(exc, match="kvshm"):
        LocalIndexer(**kwargs)
    assert list(ring_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("KVSHM_RING_BYTES", "lots"), ("KVSHM_DP_RANK", "one"), ("KVSHM_DP_RANK", "-1"), ("KVSHM_DP_RANK", "4294967296")],
)
def test_bad_env(ring_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        LocalIndexer(0, 4, ring_dir=ring_dir)
    assert list(ring_dir.iterdir()) == []


def test_indexer_still_works_after_errors(make_indexer: IndexerFactory) -> None:
    ix = make_indexer()
    with pytest.raises(ValueError):
        ix.apply_stored(0, toks(0, 4), [U64])
    ix.apply_stored(0, toks(0, 4), [1])
    assert event_ids(query(ix, 0)) == [0]
