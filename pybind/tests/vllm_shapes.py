"""vLLM 0.33.0's KV-event wire shapes (vllm/distributed/kv_events.py) as msgspec Structs, the reference encoding
of a batch for the tests that compare kvshmd's ZMQ stream with what vLLM would send, and pyzmq helpers."""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from kvshm import LocalIndexer
from kvshm import events as ke


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(_KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(_KVCacheEvent):
    pass


class KVEventBatch(_EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def vllm_payload(ts: float, events: list[Any], dp: int) -> bytes:
    return msgspec.msgpack.encode(KVEventBatch(ts=ts, events=events, data_parallel_rank=dp))



def sub_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    return s


def join(ix: LocalIndexer, sub: zmq.Socket[bytes]) -> int:
    """Publishes one-event warm-up batches until the subscriber receives one (PUB drops what it sends before the
    subscription arrives); returns the next free seq."""
    seq = 0
    sub.setsockopt(zmq.RCVTIMEO, 100)
    while True:
        ix.apply_batch(seq, [ke.AllBlocksCleared()], ts=1.0)
        seq += 1
        try:
            frames = sub.recv_multipart()
        except zmq.Again:
            assert seq < 300, "the subscriber never received a batch"
            continue
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        last = int.from_bytes(frames[1], "big")
        while last != seq - 1:  # drain the warm-ups still in flight
            last = int.from_bytes(sub.recv_multipart()[1], "big")
        return seq
