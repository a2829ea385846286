"""vLLM-shaped KV-cache events for :meth:`kvshm.LocalIndexer.apply_batch`, without msgspec.

The classes mirror vLLM 0.33.0's ``vllm.distributed.kv_events`` (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``, ``KVEventBatch``): same field names, order and defaults, as slots dataclasses, so an engine
that is not vLLM (TensorRT-LLM, a test) builds the same events positionally or by keyword. ``apply_batch`` takes
these and vLLM's own msgspec objects alike: it recognizes an event by its class name and reads the attributes.
Block hashes are ints or, as vLLM sends them with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, ``bytes``
(vLLM's ``ExternalBlockHash``; see ``apply_batch``).

What kvshm carries to the ZMQ stream (kvshm.LocalIndexer(publish=...)): every field up to
``kv_cache_spec_sliding_window``. vLLM 0.33.0's newer trailing fields (``locality``, ``ownership``,
``session_id``, ``lookahead_token_ids``) are accepted and not carried: an event that sets one is published without
it and counted in ``stats()["batch"]["fields_dropped"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "MEDIUM_CPU", "MEDIUM_GPU"]

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


@dataclass(slots=True)
class BlockStored:
    """Blocks stored in the engine's prefix cache, as one chain under ``parent_block_hash`` (None: the root)."""

    block_hashes: list[int] | list[bytes]  # vLLM: list[ExternalBlockHash]; kvshm refuses mixed lists
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


@dataclass(slots=True)
class BlockRemoved:
    """Blocks evicted from the engine's prefix cache."""

    block_hashes: list[int] | list[bytes]  # vLLM: list[ExternalBlockHash]; kvshm refuses mixed lists
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    """Every block of the engine (this publisher's scope) was dropped."""


@dataclass(slots=True)
class KVEventBatch:
    """One batch as vLLM publishes it: the engine's ``time.time()``, the events, the DP rank (None: the
    publisher's)."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared] = field(default_factory=list)
    data_parallel_rank: int | None = None
