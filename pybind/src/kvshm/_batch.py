"""Batches of vLLM-shaped events (``LocalIndexer.apply_batch``) and the ZMQ publishing request (``ZmqPublish``).

A batch is written as ONE ring record (type BATCH, shm/FORMAT.md) when the daemon said it reads them (ATTACH reply
``"batches": true``): per event an EVENT sub-record, byte-identical to what ``apply_stored`` / ``apply_removed`` /
``apply_cleared`` write (the same prepare functions of :mod:`kvshm._encode`, with the batch's seq and dp_rank), and,
unless the event's metadata are the defaults (medium "GPU" and nothing else: vLLM's common event, and what an
EVENT without META stands for, as a single-event record does), a META sub-record (``kvevent.Meta``, absent fields
= None) right before it. Meta bytes are cached per distinct value (one dict lookup); an event with
``extra_keys`` encodes them with msgspec (imported on first use: vLLM always has it) and is not cached. An event
with medium None gets an empty META (every field None).

What goes into Meta: ``medium``, ``lora_id``, ``block_size`` only when it differs from the stream's
``kv_block_size``, ``extra_keys``, ``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``; for a
stream published in SGLang's wire (``wire="sglang"``), SGLang's ``cache_salt`` and ``session_id`` too. vLLM's newer
trailing fields (``locality``, ``ownership``, ``session_id``, ``lookahead_token_ids``) have no place in vLLM's
layouts as kvshmd writes them: an event that sets one is published without it and counted (``fields_dropped``).

Bytes block hashes (vLLM with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`` sends ``bytes``, sha256 digests by
default): an event whose first block hash is ``bytes`` has all of them ``bytes`` of one length (else TypeError /
ValueError); the EVENT carries their index keys (the last 8 bytes, big-endian: the int vLLM sends for the same hash
with the variable unset, and newer Dynamo's rule for bytes; Dynamo 1.6.1 cannot decode them at all), the META their
bytes, so kvshmd publishes them as msgpack bin as vLLM does. A ``bytes`` parent hash likewise. Such a META is not
cached. A daemon without BATCH records (the fallback) gets the keys only and publishes ints.

Eagle: a ``BlockStored`` whose ``token_ids`` are pairs (Dynamo's bigram form: ``[(t0, t1), (t1, t2), ...]``) is
published as Eagle, tokens = the first of every pair plus the second of the last (Dynamo's
``normalize_token_ids``); plain ints are not Eagle.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._batchrec import build_meta
from ._encode import Prepared, prepare_cleared, prepare_removed, prepare_stored

__all__ = ["WIRES", "ZmqPublish", "offset_endpoint_port", "BatchBuilder"]

# The KV-event layouts kvshmd can publish (vllmwire.Wire), the default first: vLLM's releases, which differ in
# BlockStored's fields (0.32.0 lacks lookahead_token_ids), which changes msgspec's map header on the wire; 0.31.0
# publishes 0.32.0's layout (vllmwire, "Releases"); and "array", 0.32.0's structs encoded array_like, the
# positional layout llm-d-kv-cache's vLLM adapter decodes. "sglang" is SGLang 0.5.23's wire (its own BlockStored,
# signed int64 block hashes: vllmwire/FORMAT.md).
WIRES: Final = ("0.33", "0.32", "0.31", "array", "sglang")
SGLANG_WIRE: Final = "sglang"


@dataclass(frozen=True, slots=True)
class ZmqPublish:
    """Ask kvshmd to publish this producer's stream on ZMQ in vLLM's KV-event wire format (PUB on ``endpoint``,
    replay ROUTER on ``replay_endpoint`` when given). The defaults are vLLM's ``KVEventsConfig``'s. Endpoints with
    ``*``, ``::`` or ``ipc://`` are bound by kvshmd, others connected; with ``LocalIndexer(dp_rank=r)`` the ports
    are offset by ``r`` as vLLM does (:func:`offset_endpoint_port`). ``wire`` is the vLLM release whose structs
    the payloads follow, byte for byte: ``"0.33"`` (vLLM 0.33.0, the default), ``"0.32"`` (vLLM 0.32.0) or
    ``"0.31"`` (vLLM 0.31.0); the vLLM plugin passes the installed vLLM's. ``"array"`` is vLLM 0.32.0's events
    encoded array_like (positional), the layout llm-d's consumer (llm-d-kv-cache) decodes: it refuses the map
    layouts. ``"sglang"`` is SGLang 0.5.23's wire (the SGLang plugin's)."""

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    hwm: int = 100_000
    buffer_steps: int = 10_000
    wire: str = WIRES[0]

    def __post_init__(self) -> None:
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"kvshm: ZmqPublish.{name} must be a str, not {type(getattr(self, name)).__name__}")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise TypeError("kvshm: ZmqPublish.replay_endpoint must be a str or None")
        if not self.endpoint:
            raise ValueError("kvshm: ZmqPublish.endpoint is empty")
        if not isinstance(self.wire, str):
            raise TypeError(f"kvshm: ZmqPublish.wire must be a str, not {type(self.wire).__name__}")
        if self.wire not in WIRES:
            raise ValueError(f"kvshm: ZmqPublish.wire {self.wire!r} is not a known vLLM release: one of {WIRES}")
        for name in ("hwm", "buffer_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"kvshm: ZmqPublish.{name} must be an int, not {type(v).__name__}")
            if not 0 <= v < 1 << 31:
                raise ValueError(f"kvshm: ZmqPublish.{name} {v} is out of range [0, 2**31)")

    def for_rank(self, dp_rank: int | None) -> ZmqPublish:
        """This request with vLLM's dp_rank offset applied to both endpoints (nothing to do for None or 0)."""
        if not dp_rank:
            return self
        replay = offset_endpoint_port(self.replay_endpoint, dp_rank)
        return ZmqPublish(
            endpoint=offset_endpoint_port(self.endpoint, dp_rank) or self.endpoint,
            replay_endpoint=replay,
            topic=self.topic,
            hwm=self.hwm,
            buffer_steps=self.buffer_steps,
            wire=self.wire,
        )

    def to_json(self) -> dict[str, Any]:
        """The ATTACH body's ``publish`` object (proto/sock PROTOCOL.md). ``wire`` is sent only when it is not the
        default, so a kvshmd older than the field (it refuses unknown fields) still takes the default."""
        out: dict[str, Any] = {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.topic,
            "hwm": self.hwm,
            "buffer_steps": self.buffer_steps,
        }
        if self.wire != WIRES[0]:
            out["wire"] = self.wire
        return out


_PORT: Final = re.compile(r"^(.*):(\d+)$")


def offset_endpoint_port(endpoint: str | None, dp_rank: int) -> str | None:
    """vLLM's ``ZmqEventPublisher.offset_endpoint_port``: None or rank 0 unchanged; ``inproc`` gets a ``_dp<r>``
    suffix; a ``tcp`` endpoint's port is offset by the rank (port 0 stays 0: the OS picks); anything else (ipc://
    with a rank > 0) raises ValueError, as in vLLM."""
    if not endpoint or dp_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{dp_rank}"
    if "tcp" in endpoint:
        m = _PORT.match(endpoint)
        if m is None:
            return endpoint
        port = int(m.group(2))
        if port == 0:
            return endpoint
        return f"{m.group(1)}:{port + dp_rank}"
    raise ValueError(f"kvshm: invalid endpoint {endpoint!r} for dp_rank {dp_rank}: must contain 'inproc' or 'tcp'")


_META_CACHE_MAX: Final = 1024
_EMPTY: Final = b""
_GPU_MEDIUMS: Final = frozenset({None, "", "GPU"})


def _msgpack(value: object) -> bytes:
    """msgspec's msgpack of an extra_keys value (vLLM encodes its batches with msgspec, so these are the bytes its
    wire carries for the field)."""
    try:
        import msgspec
    except ImportError:
        raise TypeError(
            "kvshm: an event with extra_keys needs msgspec to encode them (pip install msgspec; vLLM has it)"
        ) from None
    try:
        return bytes(msgspec.msgpack.encode(value))
    except (TypeError, msgspec.EncodeError) as e:
        raise TypeError(f"kvshm: extra_keys cannot be encoded with msgspec: {e}") from None


def _hash_key(h: bytes) -> int:
    """The index key of a bytes block hash: its last 8 bytes, big-endian (vllmwire.HashKey)."""
    return int.from_bytes(h[-8:], "big")


def _bytes_hashes(hashes: Sequence[Any], what: str) -> tuple[list[int], bytes]:
    """The keys and the concatenation of an event's bytes block hashes (the first one is bytes). TypeError when
    one is not bytes, ValueError when their lengths differ (the ring carries one length per event)."""
    size = len(hashes[0])
    for h in hashes:
        if h.__class__ is not bytes:
            raise TypeError(f"kvshm: {what} mixes bytes and {type(h).__name__} block hashes")
        if len(h) != size:
            raise ValueError(f"kvshm: {what} has bytes block hashes of {size} and {len(h)} bytes")
    return [int.from_bytes(h[-8:], "big") for h in hashes], b"".join(hashes)


def _bigram(tokens: Sequence[Any]) -> list[int]:
    """Dynamo's normalize_token_ids for Eagle's pairs: the first of every pair, then the second of the last."""
    try:
        out = [p[0] for p in tokens]
        out.append(tokens[-1][1])
    except (TypeError, IndexError, KeyError):
        raise TypeError("kvshm: BlockStored.token_ids must be ints or (int, int) pairs (Eagle)") from None
    return out


class BatchBuilder:
    """Turns vLLM-shaped events into prepared sub-records for one stream (kv_block_size), with the Meta cache.
    Owned by one LocalIndexer; used under its publishing lock."""

    __slots__ = ("kv_block_size", "_cache", "fields_dropped", "_sglang")

    def __init__(self, kv_block_size: int, wire: str | None = None) -> None:
        self.kv_block_size = kv_block_size
        self._sglang = wire == SGLANG_WIRE  # cache_salt and session_id are carried (SGLang's BlockStored)
        self._cache: dict[tuple[Any, ...], bytes] = {}
        self.fields_dropped = 0  # events published without locality/ownership/session_id/lookahead_token_ids

    def _meta(
        self,
        medium: Any,
        lora_id: Any,
        block_size: Any,
        group_idx: Any,
        kind: Any,
        window: Any,
        extra: Any,
        hash_bytes: bytes | None = None,
        parent_bytes: bytes | None = None,
        salt: Any = None,
        session: Any = None,
    ) -> bytes:
        if extra is not None or hash_bytes is not None or parent_bytes is not None or salt is not None \
                or session is not None:
            return build_meta(medium, lora_id, block_size, None if extra is None else _msgpack(extra), group_idx,
                              kind, window, hash_bytes, parent_bytes, salt, session)
        key = (medium, lora_id, block_size, group_idx, kind, window)
        try:
            meta = self._cache.get(key)
        except TypeError:  # an unhashable value: build_meta gives the right error
            meta = None
        if meta is None:
            if medium == "GPU" and lora_id is None and block_size is None and group_idx is None and kind is None \
                    and window is None:
                meta = _EMPTY  # the defaults of an EVENT without META: no sub-record
            else:
                meta = build_meta(medium, lora_id, block_size, None, group_idx, kind, window)
            if len(self._cache) >= _META_CACHE_MAX:
                self._cache.clear()
            self._cache[key] = meta
        return meta

    def subs(self, seq: int, dp_rank: int, events: Sequence[Any]) -> tuple[list[Any], int]:
        """The sub-records of a batch (META bytes before their EVENT, prepared EVENTs), and how many events carried
        metadata. TypeError/ValueError for a bad event (nothing is written by the caller then)."""
        subs: list[Any] = []
        with_meta = 0
        kv_bs = self.kv_block_size
        for e in events:
            name = e.__class__.__name__
            if name == "BlockStored":
                tokens = e.token_ids
                eagle = False
                if tokens and tokens[0].__class__ in (tuple, list):
                    tokens, eagle = _bigram(tokens), True
                hashes, parent = e.block_hashes, e.parent_block_hash
                hbytes = pbytes = None
                if hashes and hashes[0].__class__ is bytes:
                    hashes, hbytes = _bytes_hashes(hashes, "BlockStored")
                if parent.__class__ is bytes:
                    pbytes, parent = parent, _hash_key(parent)
                ev = prepare_stored(seq, tokens, hashes, parent, dp_rank, e.lora_name, eagle)
                bs = e.block_size
                if bs.__class__ is not int:
                    bs = _index(bs, "BlockStored.block_size")
                meta = self._meta(
                    e.medium,
                    e.lora_id,
                    None if bs == kv_bs else bs,
                    getattr(e, "group_idx", None),
                    getattr(e, "kv_cache_spec_kind", None),
                    getattr(e, "kv_cache_spec_sliding_window", None),
                    getattr(e, "extra_keys", None),
                    hbytes,
                    pbytes,
                    getattr(e, "cache_salt", None) if self._sglang else None,
                    getattr(e, "session_id", None) if self._sglang else None,
                )
                if (
                    getattr(e, "locality", None) is not None
                    or getattr(e, "ownership", None) is not None
                    or (not self._sglang and getattr(e, "session_id", None) is not None)
                    or getattr(e, "lookahead_token_ids", None) is not None
                ):
                    self.fields_dropped += 1
            elif name == "BlockRemoved":
                hashes, hbytes = e.block_hashes, None
                if hashes and hashes[0].__class__ is bytes:
                    hashes, hbytes = _bytes_hashes(hashes, "BlockRemoved")
                ev = prepare_removed(seq, hashes, dp_rank)
                meta = self._meta(e.medium, None, None, getattr(e, "group_idx", None), None, None, None, hbytes)
                if getattr(e, "locality", None) is not None or getattr(e, "ownership", None) is not None:
                    self.fields_dropped += 1
            elif name == "AllBlocksCleared":
                ev = prepare_cleared(seq, dp_rank)
                meta = _EMPTY
            else:
                raise TypeError(
                    f"kvshm: apply_batch takes BlockStored, BlockRemoved and AllBlocksCleared events "
                    f"(vLLM's or kvshm.events'), not {name}"
                )
            if meta:
                subs.append(meta)
                with_meta += 1
            subs.append(ev)
        return subs, with_meta

    def indexed(self, e: Any) -> bool:
        """Whether kvshmd would apply ``e`` to the index (the device-tree filter, docs/decisions.md: the part a
        per-event fallback can check: medium absent or GPU, block_size the stream's, group 0 or absent)."""
        name = e.__class__.__name__
        if name == "AllBlocksCleared":
            return True
        if getattr(e, "medium", None) not in _GPU_MEDIUMS or getattr(e, "group_idx", None) not in (None, 0):
            return False
        return name != "BlockStored" or bool(e.block_size == self.kv_block_size)

    def fallback(self, e: Any, seq: int, dp_rank: int) -> Prepared | None:
        """The single EVENT of ``e`` for a daemon without BATCH records (None: not indexed, skipped)."""
        name = e.__class__.__name__
        if name not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
            raise TypeError(
                f"kvshm: apply_batch takes BlockStored, BlockRemoved and AllBlocksCleared events "
                f"(vLLM's or kvshm.events'), not {name}"
            )
        if not self.indexed(e):
            return None
        hashes = e.block_hashes if name != "AllBlocksCleared" else ()
        if hashes and hashes[0].__class__ is bytes:
            hashes, _ = _bytes_hashes(hashes, name)
        if name == "BlockStored":
            tokens = e.token_ids
            eagle = False
            if tokens and tokens[0].__class__ in (tuple, list):
                tokens, eagle = _bigram(tokens), True
            parent = e.parent_block_hash
            if parent.__class__ is bytes:
                parent = _hash_key(parent)
            return prepare_stored(seq, tokens, hashes, parent, dp_rank, e.lora_name, eagle)
        if name == "BlockRemoved":
            return prepare_removed(seq, hashes, dp_rank)
        return prepare_cleared(seq, dp_rank)


def _index(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"kvshm: {what} must be an int, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"kvshm: {what} must be an int, not {type(value).__name__}") from None
