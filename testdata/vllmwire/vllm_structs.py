"""vLLM 0.33.0's KV-event wire as msgspec Structs: the one reference shape for every test, benchmark and judge.

The same field names, order, types, defaults and struct options as ``vllm/distributed/kv_events.py`` of vLLM 0.33.0
(written from it, not copied): the batch is ``EventBatch(array_like=True, omit_defaults=True)``, encoded as
``[ts, [events...], data_parallel_rank]``; the events are ``KVCacheEvent(omit_defaults=True, tag=True)``
subclasses, NOT array_like, so each event is a tagged msgpack map whose fields at their default value are omitted.
``ExternalBlockHash`` is ``bytes | int`` in vLLM.

Users: testdata/vllmwire/gen_vectors.py (vllmwire's byte-identity vectors), pybind/tests (kvshmd's ZMQ stream
against vLLM's encoding), bench/_vllm.py (the engine's own publisher, side (a)), conformance's reference publisher
(kvshm_conf.vllm_ref). ``kvshm.events`` mirrors these classes without msgspec; pybind/tests/test_vllm_plugin.py checks
that the two agree field by field, and ``make vllm-plugin-test`` checks kvshm's stream against vLLM itself.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "payload",
]


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """The tagged base: msgspec writes the subclass name under the key ``type``."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
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


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


Event = BlockStored | BlockRemoved | AllBlocksCleared

_encoder = msgspec.msgpack.Encoder()


def payload(ts: float, events: list[Any], data_parallel_rank: int | None) -> bytes:
    """The msgpack payload vLLM sends for one batch (the third frame of ``[topic, seq, payload]``)."""
    return _encoder.encode(KVEventBatch(ts=ts, events=events, data_parallel_rank=data_parallel_rank))
