"""Event metadata (``kvevent.Meta``) and BATCH records (shm/FORMAT.md, "BATCH record"), for ``apply_batch``.

Meta is small and cached per distinct value, so it is built by a minimal FlatBuffers builder for one table (no
runtime dependency; :class:`kvshm._fbsim.Sim`) that follows the official builders' arithmetic and kvshm's canonical
call order (Go: fbs.BuildMeta): [parent bytes = CreateByteVector], [hash bytes = CreateByteVector], [kind =
CreateString], [extra = CreateByteVector], [medium = CreateString], MetaStart, the present fields in schema order,
MetaEnd, Finish without file identifier. Tests prove byte identity with the official Python builder and with the
shared vectors (testdata/batch) that the Go side checks too. A BATCH record carries META and EVENT sub-records
(events prepared by :mod:`kvshm._encode` with the batch's seq and dp_rank).
"""

from __future__ import annotations

import operator
import struct
from typing import Any, Final

from ._encode import Buffer, Prepared
from ._fbsim import Sim

__all__ = ["BATCH_HEADER", "RECORD_BATCH", "SUB_EVENT", "SUB_META", "build_meta", "prepare_batch"]

RECORD_BATCH: Final = 3  # ring record type of a batch
SUB_EVENT: Final = 1  # sub-record types inside a BATCH
SUB_META: Final = 4
BATCH_HEADER: Final = 16  # ts f64, count u32, flags u32

# Meta's vtable slots (proto/fbs/event.fbs): medium, lora_id, block_size, extra_keys, group_idx, kind, window,
# block_hash_bytes, parent_hash_bytes, cache_salt, session_id.
_META_FIELDS: Final = 11


def build_meta(
    medium: str | None = None,
    lora_id: int | None = None,
    block_size: int | None = None,
    extra_keys: bytes | None = None,
    group_idx: int | None = None,
    kind: str | None = None,
    sliding_window: int | None = None,
    hash_bytes: bytes | None = None,
    parent_bytes: bytes | None = None,
    cache_salt: str | None = None,
    session_id: str | None = None,
) -> bytes:
    """The canonical ``kvevent.Meta`` FlatBuffer (None = absent; ``extra_keys`` already msgpack-encoded;
    ``hash_bytes`` the event's bytes block hashes concatenated, ``parent_bytes`` its parent's; ``cache_salt`` and
    ``session_id`` SGLang's).
    TypeError/ValueError for values that do not fit their fields (lora_id i64, the others u32, strings UTF-8)."""
    ints = [lora_id, block_size, group_idx, sliding_window]
    for i, v in enumerate(ints):
        if v is not None and v.__class__ is not int:
            if isinstance(v, bool):
                raise TypeError("kvshm: event metadata integers must be ints, not bool")
            try:
                ints[i] = operator.index(v)
            except TypeError:
                raise TypeError(f"kvshm: event metadata integers must be ints, not {type(v).__name__}") from None
    lora_id, block_size, group_idx, sliding_window = ints
    b = Sim(0, 1)  # the same builder arithmetic as the EVENT layouts, here with constant bytes only
    try:
        session_off = b.bytes_vector(session_id.encode("utf-8"), True) if session_id is not None else 0
        salt_off = b.bytes_vector(cache_salt.encode("utf-8"), True) if cache_salt is not None else 0
        parent_off = b.bytes_vector(parent_bytes, False) if parent_bytes is not None else 0
        hashes_off = b.bytes_vector(hash_bytes, False) if hash_bytes is not None else 0
        kind_off = b.bytes_vector(kind.encode("utf-8"), True) if kind is not None else 0
        extra_off = b.bytes_vector(bytes(extra_keys), False) if extra_keys is not None else 0
        medium_off = b.bytes_vector(medium.encode("utf-8"), True) if medium is not None else 0
        b.start_object(_META_FIELDS)
        if medium is not None:
            b.prepend_uoffset(medium_off)
            b.slot(0)
        if lora_id is not None:
            b.prepend("q", lora_id)
            b.slot(1)
        if block_size is not None:
            b.prepend("I", block_size)
            b.slot(2)
        if extra_keys is not None:
            b.prepend_uoffset(extra_off)
            b.slot(3)
        if group_idx is not None:
            b.prepend("I", group_idx)
            b.slot(4)
        if kind is not None:
            b.prepend_uoffset(kind_off)
            b.slot(5)
        if sliding_window is not None:
            b.prepend("I", sliding_window)
            b.slot(6)
        if hash_bytes is not None:
            b.prepend_uoffset(hashes_off)
            b.slot(7)
        if parent_bytes is not None:
            b.prepend_uoffset(parent_off)
            b.slot(8)
        if cache_salt is not None:
            b.prepend_uoffset(salt_off)
            b.slot(9)
        if session_id is not None:
            b.prepend_uoffset(session_off)
            b.slot(10)
    except struct.error as e:
        raise ValueError(f"kvshm: event metadata out of range: {e}") from None
    except (AttributeError, UnicodeEncodeError) as e:
        raise TypeError(f"kvshm: event metadata strings must be str: {e}") from None
    b.finish(b.end_object(), identifier=False)
    return b.to_bytes()


_SUB_HEADER: Final = struct.Struct("<II")
_BATCH_HEAD: Final = struct.Struct("<IIdII")  # record length, type 3, ts, count, flags
_ZEROS: Final = bytes(8)


def _write_batch(buf: Buffer, off: int, p: Prepared) -> None:
    """Writes a BATCH record: header, then each sub-record (META bytes, or an EVENT through its prepared writer,
    which writes the sub-record header [8+size][1] exactly as a ring EVENT record's), zero padding between."""
    size, _, _, _, _, ts, subs = p
    _BATCH_HEAD.pack_into(buf, off, size + 8, RECORD_BATCH, ts, len(subs), 0)
    pos = off + 8 + BATCH_HEADER
    last = len(subs) - 1
    for i, sub in enumerate(subs):
        if sub.__class__ is bytes:  # META
            n = 8 + len(sub)
            _SUB_HEADER.pack_into(buf, pos, n, SUB_META)
            buf[pos + 8 : pos + n] = sub
        else:
            n = 8 + sub[0]
            sub[1](buf, pos, sub)
        if i != last:
            pad = -n & 7
            if pad:
                buf[pos + n : pos + n + pad] = _ZEROS[:pad]
            n += pad
        pos += n


def prepare_batch(seq: int, dp_rank: int, ts: float, subs: list[Any]) -> Prepared:
    """A BATCH record of ``subs`` (in order: META bytes, each right before its EVENT, and prepared EVENTs, all
    prepared with this ``seq`` and ``dp_rank``); ``ts`` the engine's time (0.0 = unknown). Returns ``(size,
    writer, None, seq, dp_rank, ts, subs)`` like the other ``prepare_*`` functions (size without the record
    header)."""
    size = BATCH_HEADER
    for sub in subs:
        size += ((len(sub) if sub.__class__ is bytes else sub[0]) + 15) & ~7
    if subs:
        last = subs[-1]
        n = 8 + (len(last) if last.__class__ is bytes else last[0])
        size -= -n & 7  # the last sub-record is not padded
    return (size, _write_batch, None, seq, dp_rank, ts, subs)
