"""SGLang 0.5.23's KV-event wire as msgspec Structs, for the judges that run without SGLang (the conformance
driver's SGLang ZMQ judge, pybind's tests).

The same field names, order, types, defaults and struct options as ``sglang/srt/disaggregation/kv_events.py`` of
SGLang 0.5.23 (written from it, not copied): the batch is ``EventBatch(array_like=True)`` WITHOUT omit_defaults,
encoded as ``[ts, [events...], attn_dp_rank]``; the events are ``KVCacheEvent(omit_defaults=True, tag=True)``
subclasses, each a tagged msgpack map whose None-defaulted fields are omitted when None. Block hashes are signed
int64. ``vectors_sglang.json`` (written by SGLang's own structs, gen_sglang_vectors.py) pins them: pybind's
tests/test_sglang_plugin.py re-encodes every vector with these classes and requires the same bytes.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "signed"]


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """The tagged base: msgspec writes the subclass name under the key ``type``."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def signed(h: int) -> int:
    """SGLang's int64 of a hash kvshm keys as the 64-bit pattern h (h in [0, 2**64))."""
    return h - (1 << 64) if h >= 1 << 63 else h
