"""kvshm.integrations.trtllm.KvZmqPublisher: TensorRT-LLM's native KV-cache event dicts, translated with the tee's
rules and published by kvshmd (vLLM wire at a pyzmq subscriber, recovery ids = kvshmd's wire seqs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from vllm_shapes import first_id, recv_batch

from kvshm.integrations.trtllm import KvZmqPublisher

from helpers import event_ids, query


def block(h: int | None, toks: list[int]) -> dict[str, Any]:
    return {"block_hash": h, "tokens": [{"token_id": t} for t in toks]}


def test_tee_translation_and_publish(monkeypatch: pytest.MonkeyPatch, ring_dir: Path, short_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_RING_DIR", str(ring_dir))
    monkeypatch.setenv("KVSHM_RING_BYTES", str(1 << 20))
    endpoint = f"ipc://{short_dir}/trt.sock"
    pub = KvZmqPublisher(endpoint, kv_block_size=2, replay_endpoint=f"ipc://{short_dir}/trt-r.sock", topic="trt")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        # Initial "created" events set the max window; later events of another window are dropped.
        pub.enqueue({"event_id": 0, "window_size": 64, "data": {"type": "created"}})
        pub.enqueue({"event_id": 1, "window_size": 128, "data": {"type": "created"}})
        assert pub.max_window_size == 128 and pub.sequence == 0
        # A stored chain whose last block is partial: the partial one is neither stored nor, later, removed.
        pub.enqueue({"event_id": 2, "window_size": 128, "attention_dp_rank": 1, "data": {
            "type": "stored", "parent_hash": None, "lora_name": None,
            "blocks": [block(-5, [1, 2]), block(6, [3, 4]), block(7, [5])]}})
        pub.enqueue({"event_id": 3, "window_size": 64, "data": {"type": "stored", "parent_hash": None,
                                                               "blocks": [block(9, [9, 9])]}})  # other window
        pub.enqueue({"event_id": 4, "window_size": 128, "attention_dp_rank": 1,
                     "data": {"type": "removed", "block_hashes": [6, 7]}})
        pub.enqueue({"event_id": 5, "data": {"type": "bogus"}})  # ignored, like the tee
        pub.enqueue({"event_id": 6})  # malformed: logged and counted, never raised
        assert pub.sequence == 2 and pub.errors == 1 and pub.partial_block_hashes == set()
        # The index logs them under kvshmd's wire seqs (docs/lifecycle.md), after the incarnation's start Cleared.
        first = first_id(pub.indexer)
        resp = query(pub.indexer, first + 1)
        ids = event_ids(resp)
        assert len(ids) == 2 and first < ids[0] < ids[1], (first, ids)
        (body,) = resp.values()
        stored = body["events"][0]
        assert stored["event"]["dp_rank"] == 1
        assert [b["block_hash"] for b in stored["event"]["data"]["stored"]["blocks"]] == [2**64 - 5, 6]
        assert body["events"][1]["event"]["data"]["removed"]["block_hashes"] == [6]
        # The ZMQ side: a late subscriber gets the next events in vLLM's wire with seqs going on.
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 100)
        sub.connect(endpoint)
        eid = 7
        while True:
            pub.enqueue({"event_id": eid, "data": {"type": "removed", "block_hashes": [100 + eid]}})
            eid += 1
            try:
                topic, wire, payload = recv_batch(sub, ids[-1])
                break
            except zmq.Again:
                assert eid < 300
        assert topic == b"trt" and event_ids(query(pub.indexer, wire))[0] == wire  # one numbering: wire and index
        ts, events, dp = msgspec.msgpack.decode(payload)
        assert dp == 0 and events == [{"type": "BlockRemoved", "block_hashes": [100 + eid - 1], "medium": "GPU"}]
        assert pub.dropped == 0
    finally:
        pub.shutdown()
        sub.close(0)
        ctx.term()
