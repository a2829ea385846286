"""Tests of the ZMQ benchmark's own logic: the vLLM-shaped batches, their wire shape, the subscriber's ts reader
and the old-API indexer feed (make bench runs these first)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zmq_bench  # noqa: E402
from _vllm import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, Workload  # noqa: E402


def enc(batches: list[list[object]]) -> bytes:
    return msgspec.msgpack.encode(batches)


@pytest.mark.parametrize("name", ["headline", "mix"])
def test_workload_is_the_same_whatever_the_chunking(name: str) -> None:
    one = Workload(name)
    chunked = one.take(7) + one.take(13) + one.take(1)
    assert enc(chunked) == enc(Workload(name).take(21))  # type: ignore[arg-type]
    assert enc(Workload(name, seed=1).take(3)) != enc(Workload(name, seed=2).take(3))  # type: ignore[arg-type]


def test_headline_is_one_32x32_stored_in_chains_of_8() -> None:
    batches = Workload("headline").take(17)
    parents = []
    for b in batches:
        (ev,) = b
        assert isinstance(ev, BlockStored)
        assert len(ev.block_hashes) == 32 and len(ev.token_ids) == 32 * 32 and ev.block_size == 32
        parents.append(ev.parent_block_hash)
    assert [p is None for p in parents] == [i % 8 == 0 for i in range(17)]
    assert parents[1] == batches[0][0].block_hashes[-1]  # type: ignore[union-attr]


def test_mix_removes_only_resident_blocks_and_sometimes_clears() -> None:
    resident: set[int] = set()
    kinds: dict[str, int] = {}
    for b in Workload("mix").take(5000):
        assert 1 <= len(b) <= 4
        for ev in b:
            kinds[type(ev).__name__] = kinds.get(type(ev).__name__, 0) + 1
            if isinstance(ev, BlockStored):
                assert 1 <= len(ev.block_hashes) <= 32
                assert ev.parent_block_hash is None or ev.parent_block_hash in resident
                resident.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                assert set(ev.block_hashes) <= resident
                resident.difference_update(ev.block_hashes)
            else:
                assert isinstance(ev, AllBlocksCleared)
                resident.clear()
    assert kinds["BlockStored"] > kinds["BlockRemoved"] > kinds.get("AllBlocksCleared", 0) > 0


def test_batches_encode_as_vllm_0_33_does() -> None:
    """An array-like batch [ts, events, dp_rank] whose events are tagged maps (KVCacheEvent is not array_like in
    vLLM 0.33.0), defaults omitted."""
    (ev,) = Workload("headline").take(1)[0]
    payload = msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[ev, BlockRemoved(block_hashes=[7], medium="GPU"),
                                                                   AllBlocksCleared()], data_parallel_rank=0))
    ts, events, dp = msgspec.msgpack.decode(payload)
    assert (ts, dp) == (1.5, 0)
    assert list(events[0]) == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                               "medium", "lora_name"]
    assert events[0]["type"] == "BlockStored" and events[0]["medium"] == "GPU"
    assert events[1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}
    assert events[2] == {"type": "AllBlocksCleared"}
    # msgspec 0.23 keeps an array_like Struct's trailing default: dp_rank None is a nil, not omitted
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[]))) == [1.5, [], None]


@pytest.mark.parametrize(
    ("payload", "ts"),
    [
        (msgspec.msgpack.encode(KVEventBatch(ts=1_733_000_000.25, events=[], data_parallel_rank=3)), 1_733_000_000.25),
        (msgspec.msgpack.encode([7, [], 0]), 7.0),  # an integer ts (another encoder): the slow path
    ],
)
def test_ts_of_reads_the_batch_time(payload: bytes, ts: float) -> None:
    assert zmq_bench.ts_of(payload) == ts


def test_is_heartbeat_is_only_kvshmds_empty_batch() -> None:
    """The subscriber skips kvshmd's heartbeats (no engine batch; their ts is kvshmd's) and nothing else."""
    assert zmq_bench.is_heartbeat(msgspec.msgpack.encode(KVEventBatch(ts=1_733_000_000.25, events=[],
                                                                     data_parallel_rank=0)))
    assert not zmq_bench.is_heartbeat(msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[AllBlocksCleared()],
                                                                         data_parallel_rank=0)))
    assert not zmq_bench.is_heartbeat(msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=Workload("mix").take(1)[0])))


def test_event_indexer_gives_the_old_api_one_id_per_event() -> None:
    kvc = pytest.importorskip("kvshm_conformance")
    ix = kvc.LocalIndexer(1, 32)
    try:
        feed = zmq_bench.EventIndexer(ix)
        (stored,) = Workload("headline").take(1)[0]
        assert isinstance(stored, BlockStored)
        feed.apply(KVEventBatch(ts=0.0, events=[stored, BlockRemoved(block_hashes=stored.block_hashes[-1:],
                                                                     medium="GPU")]))
        feed.apply(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
        got = json.loads(ix.get_events_json(1, 3))["Events"]
        assert [e["event"]["event_id"] for e in got["events"]] == [1, 2, 3]
        with pytest.raises(TypeError):
            feed.apply(KVEventBatch(ts=0.0, events=["not an event"]))  # type: ignore[list-item]
    finally:
        ix.shutdown()
