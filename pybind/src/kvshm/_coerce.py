"""Argument coercion for kvshm's encoders: what the engine may pass as ids, and the arrays the encoders copy.

Validation: seq must be a u64 and dp_rank a u32, as ints or objects with ``__index__`` (``TypeError`` for None,
floats, strings; ``ValueError`` out of range, checked by the writer's ``pack_into`` before the record can be
published, see :func:`check_seq_dp`); token ids u32 and block hashes u64 (``ValueError``), where block and parent
hashes in [-2**63, 0) are taken as the two's complement u64 (engines hash with signed 64-bit integers: a list of
them converts at C speed through ``array('q')``, whose bytes are exactly those u64s); the LoRA name a ``str``
(``TypeError``) encodable as UTF-8; ``None`` and ``""`` both mean the base model. Integer-likes are accepted
wherever an integer is (numpy integer scalars, via ``operator.index``; numpy arrays, ``array.array`` and typed
memoryviews as id lists, via their ``tolist()``), without importing numpy. An id list must be a sequence:
``str``, ``bytes``, ``bytearray``, a byte ``memoryview``, a mapping (``{5: 1}`` would iterate its keys) and
non-sequences (iterators, generators, sets) raise ``TypeError``, so raw bytes never pass as a list of hashes. A
Python list is the fast path (``array.fromlist``); everything else is converted to a list first (see
:func:`int_list`). Counts are not checked against each other here: a token count that is not blocks x
block_size is encoded as given and kvshmd hashes what it can, as Dynamo does (only complete windows, zipped with
the hashes).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, SupportsIndex

__all__ = [
    "U32_MAX",
    "U64_MAX",
    "IntArray",
    "IntSequence",
    "check_seq_dp",
    "int_list",
    "seq_dp",
    "u32_array",
    "u64",
    "u64_array",
]

U32_MAX: Final = 0xFFFFFFFF
U64_MAX: Final = 0xFFFFFFFFFFFFFFFF


class IntArray(Protocol):
    """What kvshm takes from an array of integers that is not a ``Sequence`` to the type checker (a numpy array):
    its length and a ``tolist()`` of Python ints."""

    def __len__(self) -> int: ...

    def tolist(self) -> Any: ...


# Token ids and block hashes: a list (the fast path), any other sequence of integers or integer-likes (tuple,
# range, array.array, numpy integer scalars), or a numpy array. Not str, bytes, bytearray or a mapping (TypeError).
IntSequence = Sequence[SupportsIndex] | IntArray


_BYTE_FORMATS: Final = frozenset({"B", "b", "c"})


def int_list(values: object, what: str) -> list[Any]:
    """``values`` as a list, for the conversions below: a list as is; a numpy array, ``array.array`` or typed
    ``memoryview`` through its ``tolist()`` (numpy integers become Python ints at C speed; numpy is never
    imported); any other sequence (tuple, range) through ``list()``. TypeError for what is not a sequence of
    integers although Python would iterate it: ``str``, ``bytes``, ``bytearray``, a byte ``memoryview`` (raw
    bytes, never a list of ids), mappings (a dict iterates its keys), and non-sequences (iterators, generators,
    sets: the old extension took sequences only)."""
    cls = values.__class__
    if cls is list:
        return values  # type: ignore[return-value]
    if (
        isinstance(values, (str, bytes, bytearray, Mapping))
        or (cls is memoryview and values.format in _BYTE_FORMATS)  # type: ignore[attr-defined]
        or not (hasattr(cls, "__len__") and hasattr(cls, "__getitem__"))
    ):
        raise TypeError(
            f"kvshm: {what} must be a sequence of integers (list, tuple, array.array, numpy array), "
            f"not {cls.__name__}"
        )
    tolist = getattr(values, "tolist", None)
    out = tolist() if tolist is not None else list(values)  # type: ignore[call-overload]
    if out.__class__ is not list:  # a 0-d numpy array's tolist() is a scalar
        raise TypeError(f"kvshm: {what} must be a sequence of integers, not a {cls.__name__} scalar")
    return out


# Buffer formats whose bytes are already what the event carries (native little-endian: check_platform): any 8-byte
# integer is its u64 two's complement, a u32 is a token id. Others (int32 tokens may be negative, big-endian, ...)
# take the checked tolist() path.
_U64_BYTES_FORMATS: Final = frozenset({"q", "Q", "l", "L", "<q", "<Q", "<l", "<L", "=q", "=Q", "=l", "=L"})
_U32_BYTES_FORMATS: Final = frozenset({"I", "<I", "=I"})


def from_buffer(values: object, typecode: str, formats: frozenset[str], itemsize: int) -> array[int] | None:
    """An array copied from ``values``' buffer (a 1-D C-contiguous numpy array, array.array or memoryview of a
    format in ``formats``): no per-item work at all. None when ``values`` has no such buffer."""
    try:
        mv = memoryview(values)  # type: ignore[arg-type]
    except TypeError:
        return None
    with mv:
        if mv.ndim != 1 or mv.itemsize != itemsize or mv.format not in formats or not mv.c_contiguous:
            return None
        out = array(typecode)
        with mv.cast("B") as raw:  # frombytes wants a byte buffer
            out.frombytes(raw)
        return out


def u64_slow(values: list[Any], what: str) -> array[int]:
    """array('Q', values) for values array() refused: hashes in [-2**63, 0) become their two's complement;
    integer-likes (numpy integers) through operator.index."""
    out = array("Q")
    for v in values:
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"kvshm: {what} must be integers, got {type(v).__name__}") from None
        if v < 0:
            if v < -(1 << 63):
                raise ValueError(f"kvshm: {what} value {v} is not a 64-bit integer")
            v += 1 << 64
        elif v > U64_MAX:
            raise ValueError(f"kvshm: {what} value {v} is not a 64-bit integer")
        out.append(v)
    return out


def u64_array(values: object, what: str) -> array[int]:
    """The u64 bytes of values as an array: array('Q') for [0, 2**64), else array('q') for [-2**63, 2**63) (its bytes
    are exactly the two's complement u64s; engines hash with signed 64-bit integers), else a Python loop (a list
    mixing negatives with values >= 2**63, or errors). Non-lists: a buffer of 8-byte integers (an int64 or uint64
    numpy array) is copied as it is, anything else goes through :func:`int_list` first."""
    if values.__class__ is not list:
        out = from_buffer(values, "Q", _U64_BYTES_FORMATS, 8)
        if out is not None:
            return out
    items = int_list(values, what)
    out = array("Q")
    try:
        out.fromlist(items)
        return out
    except (OverflowError, TypeError):
        pass
    out = array("q")
    try:
        out.fromlist(items)
        return out
    except (OverflowError, TypeError):
        return u64_slow(items, what)


def seq_dp(seq: object, dp_rank: object) -> tuple[int, int]:
    """seq and dp_rank as ints (operator.index: int subclasses and numpy integers pass, None/float/str do not).
    Ranges are left to the writer's pack_into (see check_seq_dp)."""
    try:
        return operator.index(seq), operator.index(dp_rank)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"kvshm: seq and dp_rank must be integers, not {type(seq).__name__}, {type(dp_rank).__name__}"
        ) from None


def u32_array(values: object) -> array[int]:
    """array('I', values) for values that array.fromlist refused (not a list, or bad items); a buffer of u32 (a
    uint32 numpy array) is copied as it is."""
    if values.__class__ is not list:
        fast = from_buffer(values, "I", _U32_BYTES_FORMATS, 4)
        if fast is not None:
            return fast
    out = array("I")
    try:
        out.fromlist(int_list(values, "token ids"))
    except OverflowError:
        raise ValueError("kvshm: token ids must be in [0, 2**32)") from None
    except TypeError as e:
        raise TypeError(f"kvshm: token ids must be integers: {e}") from None
    return out


def u64(value: object, what: str) -> int:
    """A single hash (parent_hash) as a u64: ints and integer-likes (numpy integers, via operator.index)."""
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"kvshm: {what} must be an int, not {type(value).__name__}") from None
    if 0 <= v <= U64_MAX:
        return v
    if -(1 << 63) <= v < 0:
        return v + (1 << 64)
    raise ValueError(f"kvshm: {what} {v} is not a 64-bit integer")


def check_seq_dp(seq: object, dp_rank: object) -> None:
    """Raises TypeError/ValueError unless seq is a u64 and dp_rank a u32. The hot path lets struct check these
    while packing (an unpublished record may be half-written, which is harmless) and calls this for the message."""
    if not (isinstance(seq, int) and isinstance(dp_rank, int)):
        raise TypeError(f"kvshm: seq and dp_rank must be ints, not {type(seq).__name__}, {type(dp_rank).__name__}")
    if not 0 <= seq <= U64_MAX:
        raise ValueError(f"kvshm: seq {seq} is not in [0, 2**64)")
    if not 0 <= dp_rank <= U32_MAX:
        raise ValueError(f"kvshm: dp_rank {dp_rank} is not in [0, 2**32)")

