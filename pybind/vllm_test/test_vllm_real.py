"""kvshm's vLLM plugin against the real vLLM 0.33.0 (make vllm-plugin-test: a venv with `pip install vllm==0.33.0`,
torch and its CUDA libraries included, ~9 GB; no GPU needed: only vLLM's config and KV-event modules run).

vLLM's plugin loader runs the `vllm.general_plugins` entry point of the installed kvshm wheel; the test then builds
`KVEventsConfig(publisher="kvshm", ...)` (refused by vLLM without the plugin), creates the publisher through
`EventPublisherFactory.create` as vLLM's scheduler does, publishes real `KVEventBatch` objects, and checks that a
pyzmq subscriber receives exactly the frames vLLM's own ZmqEventPublisher would send (topic, seq from 0, msgspec
payload), that the replay socket answers, and that the recovery index holds the events under their seqs.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

kv_events = pytest.importorskip("vllm.distributed.kv_events")
from vllm.config.kv_events import KVEventsConfig  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisher,
    EventPublisherFactory,
    KVEventBatch,
)

from kvshm.integrations.vllm import KvshmEventPublisher  # noqa: E402


def reference(batch: Any) -> bytes:
    """vLLM's ZmqEventPublisher: publish() sets the dp rank, the thread encodes with a msgspec Encoder."""
    if batch.data_parallel_rank is None:
        batch.data_parallel_rank = 0
    return bytes(msgspec.msgpack.Encoder().encode(batch))


def test_kvshm_publisher_in_real_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    d = Path(tempfile.mkdtemp(prefix="kvv-"))
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    monkeypatch.setenv("KVSHM_WORKER_ID", "3")
    monkeypatch.setenv("KVSHM_RING_DIR", str(d))
    monkeypatch.setenv("VLLM_PLUGINS", "kvshm")
    cfg_fields: dict[str, Any] = {
        "enable_kv_cache_events": True, "publisher": "kvshm", "endpoint": f"ipc://{d}/pub.sock",
        "replay_endpoint": f"ipc://{d}/replay.sock", "topic": "kv",
    }
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader runs kvshm's entry point
    cfg = KVEventsConfig(**cfg_fields)
    assert cfg.publisher == "kvshm"
    pub = EventPublisherFactory.create(cfg, data_parallel_rank=0)
    assert isinstance(pub, KvshmEventPublisher) and isinstance(pub, EventPublisher)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    dealer = ctx.socket(zmq.DEALER)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(cfg_fields["endpoint"])
        sub.setsockopt(zmq.RCVTIMEO, 100)
        seq = 0
        while True:  # PUB drops until the subscription arrives: warm up with real batches
            pub.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
            seq += 1
            try:
                frames = sub.recv_multipart()
                break
            except zmq.Again:
                assert seq < 300
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        while int.from_bytes(frames[1], "big") != seq - 1:
            frames = sub.recv_multipart()
        batches = [
            KVEventBatch(ts=time.time(), events=[
                BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=list(range(8)), block_size=4,
                            lora_id=None, medium="GPU", lora_name=None),
            ]),
            KVEventBatch(ts=time.time(), events=[
                BlockStored(block_hashes=[13], parent_block_hash=12, token_ids=[8, 9, 10, 11], block_size=4,
                            lora_id=None, medium="GPU", lora_name=None, extra_keys=[("salt",)], group_idx=0,
                            kv_cache_spec_kind="full_attention"),
                BlockRemoved(block_hashes=[13], medium="GPU"),
                BlockStored(block_hashes=[99], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4,
                            lora_id=None, medium="CPU", lora_name=None),
            ]),
        ]
        first = seq
        for b in batches:
            pub.publish(b)
            topic, seq_bytes, payload = sub.recv_multipart()
            assert (topic, int.from_bytes(seq_bytes, "big")) == (b"kv", seq)
            assert payload == reference(b), (msgspec.msgpack.decode(payload), msgspec.msgpack.decode(reference(b)))
            seq += 1
        # Replay, as Dynamo's listener asks for a gap: DEALER [b"", start seq]; every buffered batch from it, then
        # the end marker.
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(cfg_fields["replay_endpoint"])
        dealer.send_multipart([b"", first.to_bytes(8, "big")])
        got = []
        while True:  # vLLM 0.33.0's replay frames: [b"", topic, seq, payload], then [b"", b"", END_SEQ, b""]
            frames = dealer.recv_multipart()
            if frames == [b"", b"", b"\xff" * 8, b""]:
                break
            got.append(frames)
        assert got == [[b"", b"kv", (first + i).to_bytes(8, "big"), reference(b)] for i, b in enumerate(batches)]
        # The recovery index: the batch's device events under its seq (the CPU one is not indexed).
        ix = pub.indexer
        assert ix is not None
        resp = json.loads(ix.get_events_json(first))
        assert [e["event"]["event_id"] for e in resp["Events"]["events"]] == [first, first + 1, first + 1]
        got_cfg = pub.get_publisher_config()
        assert got_cfg.publisher == "kvshm" and got_cfg.endpoint == cfg_fields["endpoint"]
    finally:
        pub.shutdown()
        sub.close(0)
        dealer.close(0)
        ctx.term()


def test_cli_kv_events_config_accepts_kvshm() -> None:
    """`vllm serve --kv-events-config '{"publisher": "kvshm", ...}'` parses once the plugin is loaded. The CLI's
    parser for a config dataclass is `TypeAdapter(KVEventsConfig).validate_json` (vllm/engine/arg_utils.py,
    parse_dataclass); building the whole EngineArgs parser needs a device (a GPU), so the test runs that step."""
    from pydantic import TypeAdapter

    from kvshm.integrations.vllm import register

    register()
    cfg = TypeAdapter(KVEventsConfig).validate_json(json.dumps(
        {"enable_kv_cache_events": True, "publisher": "kvshm", "endpoint": "tcp://*:5557",
         "replay_endpoint": "tcp://*:5558"}))
    assert cfg.publisher == "kvshm" and cfg.replay_endpoint == "tcp://*:5558"
    with pytest.raises(Exception, match="kvshm"):  # the widened Literal still refuses other names
        TypeAdapter(KVEventsConfig).validate_json(json.dumps({"publisher": "bogus"}))
