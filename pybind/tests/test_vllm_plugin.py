"""kvshm.integrations.vllm with kvshm.events objects (no vLLM needed): seqs by vLLM's rule, batches held until
the block size is known, the ZMQ stream byte-identical to vLLM's encoding, errors contained. The same publisher
driven by the real vLLM 0.33.0 (register(), KVEventsConfig(publisher="kvshm"), EventPublisherFactory) is
tests/vllm_real/test_vllm_real.py (make vllm-plugin-test)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq
from vllm_shapes import BlockRemoved, BlockStored, vllm_payload, warm_up

from kvshm import LocalIndexer
from kvshm import events as ke
from kvshm.integrations.vllm import KvshmEventPublisher

from helpers import event_ids, query


@dataclass
class Batch:  # vLLM's KVEventBatch's attributes
    ts: float
    events: list[Any] = field(default_factory=list)
    data_parallel_rank: int | None = None


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, ring_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_RING_DIR", str(ring_dir))
    monkeypatch.setenv("KVSHM_RING_BYTES", str(1 << 20))
    monkeypatch.delenv("KVSHM_KV_BLOCK_SIZE", raising=False)
    monkeypatch.setenv("KVSHM_WORKER_ID", "42")


def indexer_of(pub: KvshmEventPublisher) -> LocalIndexer | None:
    return pub.indexer  # a call: mypy must not carry a narrowing of the property across publish()


def stored(h: int, bs: int = 4, medium: str | None = "GPU") -> ke.BlockStored:
    return ke.BlockStored([h], None, [h] * bs, bs, None, medium, None)


def test_publisher_holds_until_block_size_then_streams(env: None, short_dir: Path) -> None:
    endpoint = f"ipc://{short_dir}/pub.sock"
    pub = KvshmEventPublisher(data_parallel_rank=0, endpoint=endpoint, topic="t", max_queue_size=2, extra_field=1)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        # Batches without a BlockStored wait for the block size (at most max_queue_size, the oldest dropped).
        pub.publish(Batch(1.0, [ke.BlockRemoved([1], "GPU")]))  # seq 0: dropped below
        pub.publish(Batch(2.0, []))  # empty: ignored, takes no seq
        pub.publish(Batch(3.0, [ke.BlockRemoved([2], "GPU")]))  # seq 1
        pub.publish(Batch(4.0, [ke.AllBlocksCleared()]))  # seq 2
        assert indexer_of(pub) is None and pub.held_dropped == 1
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        pub.publish(Batch(5.0, [stored(7)]))  # seq 3: the block size is 4; the held batches go first
        ix = indexer_of(pub)
        assert ix is not None and ix.stats(daemon=False)["worker_id"] == 42
        assert event_ids(query(ix, 1)) == [1, 2, 3]
        sub.connect(endpoint)
        # Late subscriber: keep publishing until it is joined (the plugin numbers the batches: seq 4 on), then
        # check the framing and bytes.
        _, seq = warm_up(lambda s: pub.publish(Batch(6.0, [stored(100 + s)])), sub, 4)
        pub.publish(Batch(7.5, [stored(9, medium=None), ke.BlockRemoved([7], "GPU")], data_parallel_rank=0))
        topic, seq_bytes, payload = sub.recv_multipart()
        assert topic == b"t" and int.from_bytes(seq_bytes, "big") == seq
        assert payload == vllm_payload(7.5, [BlockStored([9], None, [9] * 4, 4, None, None, None),
                                             BlockRemoved([7], "GPU")], 0)
    finally:
        pub.shutdown()
        sub.close(0)
        ctx.term()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish(Batch(8.0, [stored(1)]))
    pub.shutdown()  # idempotent


def test_bad_events_are_logged_not_raised(env: None, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture, short_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    pub = KvshmEventPublisher(endpoint=f"ipc://{short_dir}/p.sock")
    try:
        ix = indexer_of(pub)
        assert ix is not None  # started at once
        with caplog.at_level(logging.ERROR, logger="kvshm.vllm"):
            pub.publish(Batch(1.0, [object()]))
        assert pub.errors == 1 and "not published" in caplog.text
        pub.publish(Batch(1.0, [stored(3)]))
        assert event_ids(query(ix, 1)) == [1]
        assert pub.get_publisher_config() is None  # no vLLM installed here
    finally:
        pub.shutdown()


def test_env_validation(env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHM_WORKER_ID", "x")
    with pytest.raises(ValueError, match="KVSHM_WORKER_ID"):
        KvshmEventPublisher()


def test_entry_point_declared() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kvshm"]
    if not eps:
        pytest.skip("kvshm is not installed as a distribution here (PYTHONPATH run)")
    assert eps[0].value == "kvshm.integrations.vllm:register"


@pytest.mark.parametrize("name", ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
def test_kvshm_events_mirror_vllm_structs(name: str) -> None:
    """kvshm.events (no msgspec) and the reference vLLM 0.33.0 Structs (testdata/vllmwire/vllm_structs.py) agree:
    the same field names in the same order with the same defaults, so positional construction means the same."""
    import dataclasses

    import vllm_shapes

    ours = getattr(ke, name)
    ref = getattr(vllm_shapes, name)
    fields = dataclasses.fields(ours)
    assert tuple(f.name for f in fields) == ref.__struct_fields__
    required = len(ref.__struct_fields__) - len(ref.__struct_defaults__)
    assert [f.default for f in fields[required:]] == list(ref.__struct_defaults__)
    assert all(f.default is dataclasses.MISSING for f in fields[:required])
