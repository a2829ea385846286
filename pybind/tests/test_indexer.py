"""LocalIndexer driven the way the engine's publisher drives it (one event per seq), every get_events_json answer
parsed and checked against upstream local.rs get_events_in_id_range and the golden JSON files.

Real private kvshmd, real ring; no mocks.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
from typing import Any

import pytest

import kv_local_indexer
import kvshm
from kvshm import ClosedError, LocalIndexer

from conftest import IndexerFactory
from helpers import TESTDATA, daemon_stream, dump_blocks, event_ids, query, toks, variant, wait_for

U64 = 1 << 64


def golden(name: str) -> str:
    return (TESTDATA / "json" / name).read_text().strip()


# --------------------------------------------------------------------------------------------------------------
# Golden files (testdata/json, written by the index package from the same inputs; see index/json_test.go).


def test_golden_events(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=7, kv_block_size=4, max_buffer_size=10)
    ix.apply_stored(1, toks(0, 8), [101, 102])
    ix.apply_stored(2, toks(8, 4), [103], parent_hash=102, lora_name="my-adapter")
    ix.apply_removed(3, [103])
    ix.apply_cleared(4)
    assert ix.get_events_json(2) == golden("events.json")


def test_golden_tree_dump_too_new_invalid_range(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=7, kv_block_size=4, max_buffer_size=10)
    ix.apply_stored(1, toks(0, 8), [101, 102])
    ix.apply_stored(2, toks(100, 4), [201], parent_hash=101)
    ix.apply_stored(3, toks(0, 4), [101], dp_rank=1)
    # The index lists nodes breadth-first, siblings in insertion order, dp_ranks ascending (testdata/json/README.md).
    assert ix.get_events_json() == golden("tree_dump.json")
    assert json.loads(golden("tree_dump.json"))["TreeDump"]["last_event_id"] == 3
    assert ix.get_events_json(10, 20) == golden("too_new.json")
    assert ix.get_events_json(5, 2) == golden("invalid_range.json")


def test_golden_gap_is_not_a_loss(make_indexer: IndexerFactory) -> None:
    """Ids the producer never handed over (vLLM skips feeding some events after they took a seq) are not a loss:
    the answer is Dynamo 1.6.1's, and nothing is reported incomplete."""
    ix = make_indexer(worker_id=7, kv_block_size=4, max_buffer_size=10)
    ix.apply_stored(1, toks(0, 4), [101])
    ix.apply_stored(5, toks(4, 4), [102], parent_hash=101)  # ids 2..4 never arrive
    assert ix.get_events_json() == golden("gap.json")
    st = ix.stats()
    assert st["incomplete"] is False and not st["lost_ranges"], st


def test_golden_stale_hash(make_indexer: IndexerFactory) -> None:
    """Store 101; 102 under it (tokens T); remove 102; 103 under 101 with the same tokens T: the dump says
    101 -> 103, as 1.6.1 does (never the stale 102)."""
    ix = make_indexer(worker_id=7, kv_block_size=4, max_buffer_size=10)
    ix.apply_stored(1, toks(0, 4), [101])
    ix.apply_stored(2, toks(4, 4), [102], parent_hash=101)
    ix.apply_removed(3, [102])
    ix.apply_stored(4, toks(4, 4), [103], parent_hash=101)
    assert ix.get_events_json() == golden("stale_hash.json")
    assert {(parent, bh) for _, parent, bh, _ in dump_blocks(query(ix))} == {(None, 101), (101, 103)}


def test_golden_token_mismatch(make_indexer: IndexerFactory) -> None:
    """Token counts that are not blocks x kv_block_size are accepted and hashed as 1.6.1 does (complete windows
    zipped with the hashes), and counted by the daemon."""
    ix = make_indexer(worker_id=7, kv_block_size=4, max_buffer_size=10)
    ix.apply_stored(1, toks(0, 9), [1, 2, 3])  # 2 complete windows for 3 hashes: blocks 1, 2
    ix.apply_stored(2, toks(100, 12), [4], parent_hash=2)  # 3 windows for 1 hash: block 4
    ix.apply_stored(3, toks(200, 9), [5, 6], parent_hash=4, is_eagle=True)  # Eagle: 2 x 4 + 1, no mismatch
    assert ix.get_events_json() == golden("token_mismatch.json")
    st = ix.stats()
    assert st["token_mismatches"] == 2 and st["incomplete"] is False, st


# --------------------------------------------------------------------------------------------------------------
# Upstream classification (local.rs classify_query: max_buffer_size 5, events 5..14, buffer holds 10..14).


@pytest.fixture
def ten_roots(make_indexer: IndexerFactory) -> LocalIndexer:
    ix = make_indexer(worker_id=1, kv_block_size=4, max_buffer_size=5)
    for seq in range(5, 15):
        ix.apply_stored(seq, toks(seq * 4, 4), [1000 + seq])
    return ix


@pytest.mark.parametrize(
    ("start", "end", "want_variant", "want_ids"),
    [
        (11, None, "Events", [11, 12, 13, 14]),
        (10, 14, "Events", [10, 11, 12, 13, 14]),
        (11, 12, "Events", [11, 12, 13, 14]),  # the end bound is ignored: suffix to the tail
        (12, 12, "Events", [12, 13, 14]),
        (14, None, "Events", [14]),
        (None, None, "TreeDump", list(range(10))),
        (7, None, "TreeDump", list(range(10))),  # older than the buffer
        (0, 3, "TreeDump", list(range(10))),
    ],
)
def test_reference_table(
    ten_roots: LocalIndexer, start: int | None, end: int | None, want_variant: str, want_ids: list[int]
) -> None:
    resp = query(ten_roots, start, end)
    assert variant(resp) == want_variant
    assert event_ids(resp) == want_ids
    assert resp[want_variant]["last_event_id"] == 14


def test_reference_table_too_new_and_invalid_range(ten_roots: LocalIndexer) -> None:
    assert query(ten_roots, 15, 10) == {"InvalidRange": {"start_id": 15, "end_id": 10}}
    assert query(ten_roots, 100, 200) == {
        "TooNew": {"requested_start": 100, "requested_end": 200, "newest_available": 14}
    }
    assert query(ten_roots, 15) == {"TooNew": {"requested_start": 15, "requested_end": 14, "newest_available": 14}}


def test_empty_indexer_dumps_nothing(make_indexer: IndexerFactory) -> None:
    ix = make_indexer()
    assert query(ix) == {"TreeDump": {"events": [], "last_event_id": 0, "reset_scope": "all"}}
    assert query(ix, 0) == {"TreeDump": {"events": [], "last_event_id": 0, "reset_scope": "all"}}
    assert query(ix, 3, 1) == {"InvalidRange": {"start_id": 3, "end_id": 1}}


# --------------------------------------------------------------------------------------------------------------
# An engine-like stream: parents, removes, clears, several dp_ranks, LoRA, negative hashes.


class Model:
    """What the worker's cache holds, per (dp_rank, block_hash) -> (parent_hash, tokens_hash)."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[int, int], tuple[int | None, int]] = {}
        self.events: dict[int, dict[str, Any]] = {}  # seq -> the KvCacheEvent we expect in Events answers

    def dump_set(self) -> set[tuple[int, int | None, int, int]]:
        return {(dp, parent, bh, th) for (dp, bh), (parent, th) in self.blocks.items()}


def drive(ix: LocalIndexer, model: Model, bs: int) -> int:
    """Publishes a stream and records what the answers must contain; returns the last seq."""
    seq = itertools.count(0)
    tokens_hash: dict[tuple[int, int], int] = {}  # learned from the daemon's Events answers

    def stored(dp: int, parent: int | None, hashes: list[int], tokens: list[int], lora: str | None = None) -> None:
        s = next(seq)
        ix.apply_stored(s, tokens, hashes, parent_hash=parent, dp_rank=dp, lora_name=lora)
        (ev,) = query(ix, s)["Events"]["events"]
        blocks = ev["event"]["data"]["stored"]["blocks"]
        assert [b["block_hash"] for b in blocks] == [h % U64 for h in hashes]
        p = None if parent is None else parent % U64
        for h, b in zip(hashes, blocks):
            tokens_hash[(dp, h % U64)] = b["tokens_hash"]
            model.blocks[(dp, h % U64)] = (p, b["tokens_hash"])
            p = h % U64
        model.events[s] = {"dp_rank": dp, "data": ev["event"]["data"]}
        assert ev["event"]["data"]["stored"]["parent_hash"] == (None if parent is None else parent % U64)

    def removed(dp: int, hashes: list[int]) -> None:
        s = next(seq)
        ix.apply_removed(s, hashes, dp_rank=dp)
        for h in hashes:
            del model.blocks[(dp, h % U64)]
        model.events[s] = {"dp_rank": dp, "data": {"removed": {"block_hashes": [h % U64 for h in hashes]}}}

    def cleared(dp: int) -> None:
        s = next(seq)
        ix.apply_cleared(s, dp_rank=dp)
        model.blocks.clear()  # worker-wide: every dp_rank
        model.events[s] = {"dp_rank": dp, "data": "cleared"}

    stored(0, None, [11, 12], toks(0, 2 * bs))  # seq 0
    stored(0, 12, [13], toks(2 * bs, bs))
    stored(1, None, [21], toks(1000, bs))
    stored(0, None, [31], toks(0, bs), lora="adapter-a")  # same tokens as block 11, LoRA seed: another node
    removed(0, [13])
    stored(1, 21, [22, 23], toks(1000 + bs, 2 * bs))
    stored(0, None, [-5], toks(5000, bs))  # a signed engine hash: carried as its u64 two's complement
    stored(2, -5, [-(1 << 63)], toks(5000, bs))  # dp 2 under a parent it never stored: ParentBlockNotFound
    del model.blocks[(2, (1 << 63))]  # ... so the tree does not hold it (the event is still logged)
    cleared(1)  # seq 8, worker-wide
    stored(0, None, [41, 42], toks(7000, 2 * bs))
    stored(1, None, [51], toks(8000, bs), lora="adapter-b")
    stored(0, 42, [43], toks(7000 + 2 * bs, bs))
    removed(0, [43])
    stored(3, None, [61, 62, 63], toks(9000, 3 * bs))
    last = next(seq) - 1
    # tokens_hash depends on the tokens only (and the LoRA seed): the same tokens give the same hash.
    assert tokens_hash[(0, 11)] != tokens_hash[(0, 31)]
    return last


def test_engine_stream_every_query_kind(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=3, kv_block_size=4, max_buffer_size=6)
    model = Model()
    last = drive(ix, model, 4)
    first = last - 5  # the buffer keeps the 6 newest ids

    for start in range(first, last + 1):
        for end in (None, start, last, last + 100):
            resp = query(ix, start, end)
            assert variant(resp) == "Events", (start, end, resp)
            assert resp["Events"]["last_event_id"] == last
            evs = resp["Events"]["events"]
            assert event_ids(resp) == list(range(start, last + 1))
            for e in evs:
                assert e["worker_id"] == 3 and e["storage_tier"] == "device"
                want = model.events[e["event"]["event_id"]]
                assert e["event"]["dp_rank"] == want["dp_rank"]
                assert e["event"]["data"] == want["data"]

    dump_queries: list[tuple[int | None, int | None]] = [(None, None), (0, None), (first - 1, last), (None, 3)]
    for dstart, dend in dump_queries:
        resp = query(ix, dstart, dend)
        assert variant(resp) == "TreeDump", (dstart, dend)
        assert resp["TreeDump"]["last_event_id"] == last
        assert dump_blocks(resp) == model.dump_set()
        assert event_ids(resp) == list(range(len(resp["TreeDump"]["events"])))

    assert query(ix, last + 1) == {
        "TooNew": {"requested_start": last + 1, "requested_end": last, "newest_available": last}
    }
    assert query(ix, last + 1, last + 9) == {
        "TooNew": {"requested_start": last + 1, "requested_end": last + 9, "newest_available": last}
    }
    assert query(ix, last, first) == {"InvalidRange": {"start_id": last, "end_id": first}}
    assert query(ix, U64 - 1, 0) == {"InvalidRange": {"start_id": U64 - 1, "end_id": 0}}


def test_token_hash_vectors(make_indexer: IndexerFactory) -> None:
    """tokens_hash as the reference computes it (XXH3-64 seed 1337; LoRA seed; Eagle windows of bs+1)."""
    ix = make_indexer(worker_id=0, kv_block_size=4)
    ix.apply_stored(0, [0, 1, 2, 3], [1])
    ix.apply_stored(1, [0, 1, 2, 3], [2], lora_name="my-adapter")
    ix.apply_stored(2, [0, 1, 2, 3], [3], lora_name="")  # empty LoRA name = the base model
    hashes = [e["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] for e in query(ix, 0)["Events"]["events"]]
    assert hashes == [9143094415614847814, 13692202469334984872, 9143094415614847814]

    eagle = make_indexer(worker_id=0, kv_block_size=2)
    eagle.apply_stored(0, [0, 1, 2], [1], is_eagle=True)
    eagle.apply_stored(1, [0, 1, 2, 3, 4], [5, 6], is_eagle=True)  # two windows [0,1,2] and [2,3,4]
    evs = query(eagle, 0)["Events"]["events"]
    assert evs[0]["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] == 11646242937812223497
    blocks = evs[1]["event"]["data"]["stored"]["blocks"]
    assert blocks[0]["tokens_hash"] == 11646242937812223497 and blocks[1]["tokens_hash"] != blocks[0]["tokens_hash"]


def test_hash_bounds_map_to_u64(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(kv_block_size=1)
    ix.apply_stored(0, [1, 2, 3, 4], [-1, -(1 << 63), U64 - 1, 0], parent_hash=None)
    ix.apply_stored(1, [5], [7], parent_hash=-(1 << 63))
    ix.apply_removed(2, [-1, (1 << 63) - 1])
    evs = query(ix, 0)["Events"]["events"]
    stored = evs[0]["event"]["data"]["stored"]["blocks"]
    assert [b["block_hash"] for b in stored] == [U64 - 1, 1 << 63, U64 - 1, 0]
    assert evs[1]["event"]["data"]["stored"]["parent_hash"] == 1 << 63
    assert evs[2]["event"]["data"]["removed"]["block_hashes"] == [U64 - 1, (1 << 63) - 1]


# --------------------------------------------------------------------------------------------------------------
# Publishing guarantees.


def test_threads_publish_without_corruption(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=9, kv_block_size=4, ring_bytes=4 << 20)
    seqs = itertools.count()
    per_thread, nthreads = 300, 4
    errors: list[BaseException] = []

    def publish(t: int) -> None:
        try:
            for i in range(per_thread):
                s = next(seqs)
                if i % 3 == 2:
                    ix.apply_removed(s, [t * 100000 + i - 1], dp_rank=t)
                else:
                    ix.apply_stored(s, toks(i, 8), [t * 100000 + i, -(i + 1)], dp_rank=t, lora_name=f"l{t}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and not any(th.is_alive() for th in threads)
    st = ix.stats()
    assert st["published_events"] == per_thread * nthreads and st["dropped_events"] == 0
    query(ix)  # a query makes the daemon catch up with the ring (read-your-writes)
    stream = daemon_stream(st["socket_path"], 9)
    assert stream["events_received"] == per_thread * nthreads
    assert stream["corrupt_records"] == 0 and stream["malformed_events"] == 0


def test_full_ring_drops_are_counted_and_answers_stay_honest(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=4, kv_block_size=16, ring_bytes=64 << 10)
    pid = ix.stats()["daemon_pid"]
    assert pid is not None  # a private daemon
    ix.apply_stored(0, toks(0, 16), [1])
    assert variant(query(ix, 0)) == "Events"
    os.kill(pid, signal.SIGSTOP)  # the daemon stops draining: the ring fills up
    try:
        seq = 1
        while (ix.stats(daemon=False)["dropped_events"] or 0) < 5:
            ix.apply_stored(seq, toks(seq, 64), [10 * seq + 1, 10 * seq + 2, 10 * seq + 3, 10 * seq + 4])
            seq += 1
            assert seq < 10000, "the 64 KiB ring never filled up"
        st = ix.stats(daemon=False)
        assert st["ring"]["loss_pending"] and st["ring"]["loss_last_seq"] == seq - 1
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: ix.stats(daemon=False)["ring"]["used"] == 0, "the daemon to drain the ring")
    ix.apply_stored(seq, toks(60000, 16), [999])  # carries the LOSS record
    # Best effort (the default): the dump holds what kvshm applied, and the loss is reported beside it.
    resp = query(ix)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == seq, str(resp)[:300]
    held = {bh for _, _, bh, _ in dump_blocks(resp)}
    first_lost, last_lost = st["ring"]["loss_first_seq"], st["ring"]["loss_last_seq"]
    assert 999 in held and not held & {10 * s + i for s in range(first_lost, last_lost + 1) for i in range(1, 5)}
    after = ix.stats()
    assert after["incomplete"] is True, after
    lost = after["lost_ranges"] or []
    assert [(r["first"], r["last"]) for r in lost] == [(first_lost, last_lost)], after["lost_ranges"]
    ix.apply_cleared(seq + 1)  # re-bases the state: answers are complete again
    ix.apply_stored(seq + 2, toks(50000, 16), [777])
    resp = query(ix)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == seq + 2
    assert {bh for _, _, bh, _ in dump_blocks(resp)} == {777}
    assert event_ids(query(ix, seq + 1)) == [seq + 1, seq + 2]
    assert ix.stats()["incomplete"] is False


def test_stats_and_lifecycle(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=5, kv_block_size=2)
    st = ix.stats()
    assert st["mode"] == "private" and st["attached"] and st["attaches"] == 1 and st["daemon_restarts"] == 0
    assert st["published_events"] == 0 and st["dropped_events"] == 0 and st["last_error"] is None
    assert st["last_attach"]["worker_id"] == 5 and not st["last_attach"]["resumed"]
    assert os.path.exists(st["ring_path"]) and os.path.exists(st["socket_path"])
    ix.apply_cleared(0)
    assert ix.stats()["published_events"] == 1 and ix.stats()["ring"]["tail"] > 0
    assert "worker_id=5" in repr(ix) and "open" in repr(ix)
    ix.shutdown()
    ix.shutdown()  # idempotent
    assert not os.path.exists(st["ring_path"]) and not os.path.exists(os.path.dirname(st["socket_path"]))
    with pytest.raises(ClosedError):
        ix.apply_cleared(1)
    with pytest.raises(ClosedError):
        ix.get_events_json()
    assert ix.stats()["closed"] and not ix.stats()["attached"]


def test_context_manager_and_compat_module(ring_dir: os.PathLike[str]) -> None:
    assert kv_local_indexer.LocalIndexer is kvshm.LocalIndexer
    with kv_local_indexer.LocalIndexer(0, 4, 100, ring_dir=ring_dir, ring_bytes=1 << 20) as ix:
        ix.apply_stored(0, toks(0, 4), [1])
        assert event_ids(query(ix, 0)) == [0]
        ring = ix.stats()["ring_path"]
    assert not os.path.exists(ring)


def test_default_positional_signature(ring_dir: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The old extension's call shapes, with the ring placed through the environment."""
    monkeypatch.setenv("KVSHM_RING_DIR", os.fspath(ring_dir))
    monkeypatch.setenv("KVSHM_RING_BYTES", "1M")
    ix = LocalIndexer(0, 4)
    try:
        assert ix.stats()["max_buffer_size"] == 10000
        assert os.path.dirname(ix.stats()["ring_path"]) == os.fspath(ring_dir)
        assert ix.stats()["ring"]["capacity"] == 1 << 20
        ix.apply_stored(0, [1, 2, 3, 4], [10], None, 0, None, None)
        ix.apply_removed(1, [10], 0)
        ix.apply_cleared(2, 0)
        assert event_ids(json.loads(ix.get_events_json(0, None))) == [0, 1, 2]
    finally:
        ix.shutdown()


def test_concurrent_queries(make_indexer: IndexerFactory) -> None:
    """Queries from several threads (the engine's HTTP handlers) each get a complete, correct answer."""
    ix = make_indexer(worker_id=2, kv_block_size=4, max_buffer_size=50)
    for s in range(40):
        ix.apply_stored(s, toks(4 * s, 4), [s + 1], parent_hash=s if s else None)
    errors: list[str] = []

    def worker(t: int) -> None:
        for i in range(15):
            start = None if (t + i) % 3 == 0 else (t * 7 + i) % 40
            resp = query(ix, start)
            if start is None:
                ok = variant(resp) == "TreeDump" and len(dump_blocks(resp)) == 40
            else:
                ok = event_ids(resp) == list(range(start, 40))
            if not ok or resp[variant(resp)]["last_event_id"] != 39:
                errors.append(f"thread {t} start {start}: {str(resp)[:200]}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors and not any(th.is_alive() for th in threads)


def test_compat_signatures() -> None:
    """kv_local_indexer.LocalIndexer keeps the old extension's positional parameters (new ones are keyword-only)."""
    import inspect

    cls = kv_local_indexer.LocalIndexer
    assert cls is LocalIndexer

    def positional(fn: Any) -> list[str]:
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"]

    assert positional(cls) == ["worker_id", "kv_block_size", "max_buffer_size"]
    assert positional(cls.apply_stored) == [
        "seq", "token_ids", "block_hashes", "parent_hash", "dp_rank", "lora_name", "is_eagle"
    ]
    assert positional(cls.apply_removed) == ["seq", "block_hashes", "dp_rank"]
    assert positional(cls.apply_cleared) == ["seq", "dp_rank"]
    assert positional(cls.get_events_json) == ["start", "end"]
    kwonly = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert kwonly == ["socket_path", "ring_dir", "ring_bytes", "dp_rank", "publish"]
    assert positional(cls.apply_batch) == ["seq", "events", "ts", "dp_rank"]  # docs/decisions.md
