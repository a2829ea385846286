"""Schema-specific FlatBuffers encoder for kvshm events, writing straight into a buffer (the ring mapping).

The official Python builder makes several Python calls per vector element (hundreds of µs for a 1024-token
event). This encoder produces the *same bytes* as the official builders following kvshm's canonical call order
(proto/fbs/codec.go, proto/fbs/event.fbs) with a handful of C-level operations per event:

* one precompiled :class:`struct.Struct` ``pack_into`` for the ring record header and everything that is not a
  vector (root offset, identifier, both vtables, both tables, the block-hash count),
* one slice copy of ``array('Q', block_hashes)``, one small pack for the token count, one slice copy of
  ``array('I', token_ids)``, and one slice copy of a cached LoRA string chunk.

How the layout is derived. A FlatBuffer is built back to front, and every alignment decision of the builder depends
only on the current offset modulo 8. The vectors are created before the tables; the block-hash vector always ends
(in build order) at an offset that is 4 modulo 8, because its u64 elements are 8-aligned and its u32 count follows.
So everything from the block-hash count down to the start of the buffer, the "head", has a layout that depends
only on which optional fields are present (seq != 0, dp_rank != 0, parent, LoRA, Eagle): 32 Stored variants, 4
Removed and 4 Cleared. At import, :class:`_Sim` replays the canonical builder calls for each variant with the same
Prep/Pad/vtable arithmetic as the official builders, recording which bytes are constants and where the variable
fields go, and compiles the head into one Struct whose arguments always come in the same order (absent fields are
``0s`` slots fed ``b""``). Memory order of a Stored payload::

    head:   u32 root | "KVEV" | pad | Event vtable | Event table (soffset, data, type, [dp_rank], [seq])
            | Stored vtable | Stored table (soffset, [is_eagle], [lora], token_ids, block_hashes, [parent])
            | u32 block-hash count
    then:   count × u64 hashes | 0 or 4 zero bytes | u32 token count | count × u32 tokens
            | [u32 lora length | UTF-8 bytes | NUL | zero pad to 4]

Every padding byte is written (as zero): ring memory holds old records, and byte identity needs the zeros.

API (used by :mod:`kvshm._ring`; keep stable):

* ``prepare_stored(seq, token_ids, block_hashes, parent_hash, dp_rank, lora_name, is_eagle)``,
  ``prepare_removed(seq, block_hashes, dp_rank)``, ``prepare_cleared(seq, dp_rank)`` validate and convert the
  arguments (nothing is written) and return a ``Prepared`` tuple whose element 0 is the payload size in bytes and
  element 1 the function that writes it: ``p[1](buf, off, p)`` writes the 8-byte ring record header
  ``[u32 8+size][u32 1 (EVENT)]`` at ``off`` and the payload at ``off + 8``. ``buf`` is any writable buffer
  (``mmap``, ``bytearray``); the caller guarantees ``off + 8 + size <= len(buf)``.
* ``encode_stored(...)``, ``encode_removed(...)``, ``encode_cleared(...)`` return the payload as ``bytes`` (tests,
  tools).

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
:func:`_int_list`). Counts are not checked against each other here: a token count that is not blocks x
block_size is encoded as given and kvshmd hashes what it can, as Dynamo does (only complete windows, zipped with
the hashes).
"""

from __future__ import annotations

import operator
import struct
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, SupportsIndex

__all__ = [
    "BATCH_HEADER",
    "RECORD_BATCH",
    "SUB_EVENT",
    "SUB_META",
    "build_meta",
    "prepare_batch",
    "KIND_CLEARED",
    "KIND_REMOVED",
    "KIND_STORED",
    "RECORD_EVENT",
    "IntArray",
    "IntSequence",
    "Prepared",
    "encode_cleared",
    "encode_removed",
    "encode_stored",
    "prepare_cleared",
    "prepare_removed",
    "prepare_stored",
    "check_seq_dp",
]

KIND_STORED: Final = 1
KIND_REMOVED: Final = 2
KIND_CLEARED: Final = 3
RECORD_EVENT: Final = 1  # ring record type of an event (shm/FORMAT.md)
FILE_IDENTIFIER: Final = b"KVEV"
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

# A writable buffer: mmap.mmap, bytearray or a byte memoryview (typed loosely: struct and slicing accept all).
Buffer = Any
# A prepared event: (payload size, writer, ...writer-specific fields).
Prepared = tuple[Any, ...]

# --------------------------------------------------------------------------------------------------------------
# Import-time layout derivation.


class _Var:
    """A variable field of the head: its name, its struct code and (for vector offsets) a constant part."""

    __slots__ = ("name", "code", "const")

    def __init__(self, name: str, code: str, const: int = 0) -> None:
        self.name = name
        self.code = code
        self.const = const


class _Run:
    """A run of the head in memory order: constant bytes (name "C") or one variable with its padding."""

    __slots__ = ("name", "data", "code", "const")

    def __init__(self, name: str, data: bytes, code: str = "", const: int = 0) -> None:
        self.name = name
        self.data = data
        self.code = code
        self.const = const


class _Sim:
    """Replays FlatBuffers builder calls (offsets from the end of the buffer, as the builders count them),
    recording constant bytes and variable slots instead of writing a buffer."""

    def __init__(self, off: int, minalign: int) -> None:
        self.off = off
        self.minalign = minalign
        # (offset from the end at the item's *start in build order*, size, bytes | _Var)
        self.items: list[tuple[int, int, bytes | _Var]] = []
        self.vtable: list[int] = []
        self.object_end = 0

    def prep(self, size: int, additional: int) -> None:
        if size > self.minalign:
            self.minalign = size
        self.off += (-(self.off + additional)) & (size - 1)  # zero padding

    def place(self, size: int, value: bytes | _Var) -> int:
        self.off += size
        self.items.append((self.off, size, value))
        return len(self.items) - 1

    def prepend(self, code: str, value: int | _Var) -> None:
        size = struct.calcsize("<" + code)
        self.prep(size, 0)
        self.place(size, value if isinstance(value, _Var) else struct.pack("<" + code, value))

    def prepend_uoffset(self, target: int) -> None:
        """A uoffset to an object at offset ``target`` (from the end) inside the head."""
        self.prep(4, 0)
        self.place(4, struct.pack("<I", self.off + 4 - target))

    def prepend_uoffset_var(self, name: str) -> None:
        """A uoffset to a vector beyond the head: its value is (offset of the field) + a runtime distance."""
        self.prep(4, 0)
        self.place(4, _Var(name, "I", self.off + 4))

    def bytes_vector(self, data: bytes, nul: bool) -> int:
        """CreateString (``nul``) or CreateByteVector of constant bytes; returns the vector's offset."""
        body = data + b"\x00" if nul else data
        self.prep(4, len(body))
        self.place(len(body), body)
        self.prepend("I", len(data))
        return self.off

    def start_object(self, numfields: int) -> None:
        self.vtable = [0] * numfields
        self.object_end = self.off

    def slot(self, i: int) -> None:
        self.vtable[i] = self.off

    def end_object(self) -> int:
        self.prep(4, 0)
        soffset = self.place(4, b"")  # patched below
        obj = self.off
        vt = self.vtable
        while vt and vt[-1] == 0:
            vt = vt[:-1]
        for field in reversed(vt):
            self.prepend("H", obj - field if field else 0)
        self.prepend("H", obj - self.object_end)
        self.prepend("H", 2 * (len(vt) + 2))
        end, size, _ = self.items[soffset]
        self.items[soffset] = (end, size, struct.pack("<i", self.off - obj))
        return obj

    def finish(self, root: int, identifier: bool = True) -> None:
        self.prep(self.minalign, 8 if identifier else 4)
        if identifier:
            self.place(4, FILE_IDENTIFIER)
        self.prepend_uoffset(root)

    def to_bytes(self) -> bytes:
        """The finished buffer, when every item is constant (no _Var): build_meta's whole-buffer use."""
        out = bytearray(self.off)
        for end, size, value in self.items:
            assert isinstance(value, bytes), "a _Var has no bytes"
            out[self.off - end : self.off - end + size] = value
        return bytes(out)

    def compile(self, pattern: Sequence[str]) -> tuple[struct.Struct, tuple[bytes, ...], dict[str, int], int]:
        """Lays the items out in memory order and fits them to ``pattern``: "C" = a run of constant bytes
        (possibly empty), any other name = that variable (``0s`` when absent). Padding joins the item before it.
        Returns the Struct (with a leading u32 record length and the record type folded into the first constant),
        the constant chunks, the constant parts of the variables and the head size."""
        total = self.off
        layout: list[tuple[int, int, bytes | _Var]] = sorted(
            ((total - end, size, value) for end, size, value in self.items), key=lambda t: t[0]
        )
        runs: list[_Run] = [_Run("C", struct.pack("<I", RECORD_EVENT))]
        pos = 0
        for start, size, value in layout:
            gap = start - pos
            assert gap >= 0, "overlapping items"
            if gap:  # zero padding belongs to the previous run
                if runs[-1].name == "C":
                    runs[-1].data += bytes(gap)
                else:
                    runs[-1].code += "x" * gap
            if isinstance(value, _Var):
                runs.append(_Run(value.name, b"", value.code, value.const))
            elif runs[-1].name == "C":
                runs[-1].data += value
            else:
                runs.append(_Run("C", value))
            pos = start + size
        assert pos == total, "head does not end at its last item"
        fmt = ["<I"]
        consts: list[bytes] = []
        var_consts: dict[str, int] = {}
        i = 0
        for slot in pattern:
            run = runs[i] if i < len(runs) else None
            if slot == "C":
                chunk = b""
                if run is not None and run.name == "C":
                    chunk = run.data
                    i += 1
                fmt.append(f"{len(chunk)}s")
                consts.append(chunk)
            elif run is not None and run.name == slot:
                fmt.append(run.code)
                var_consts[slot] = run.const
                i += 1
            else:
                fmt.append("0s")
        assert i == len(runs), f"head items {runs[i:]} do not fit the pattern {pattern}"
        st = struct.Struct("".join(fmt))
        assert st.size == 4 + 4 + total, "struct size differs from the head size"
        return st, tuple(consts), var_consts, total


# Memory order of the head's constant runs and variables (absent variables are empty slots).
_STORED_PATTERN: Final = ("C", "dp", "seq", "C", "lora", "tok", "C", "parent", "nh")
_REMOVED_PATTERN: Final = ("C", "dp", "seq", "C", "nh")
_CLEARED_PATTERN: Final = ("C", "dp", "seq", "C")


def _event(sim: _Sim, data: int, kind: int, has_seq: bool, has_dp: bool) -> None:
    """EventStart, AddSeq, AddDpRank, AddDataType, AddData, EventEnd, Finish(KVEV)."""
    sim.start_object(4)
    if has_seq:
        sim.prepend("Q", _Var("seq", "Q"))
        sim.slot(0)
    if has_dp:
        sim.prepend("I", _Var("dp", "I"))
        sim.slot(1)
    sim.prepend("B", kind)
    sim.slot(2)
    sim.prepend_uoffset(data)
    sim.slot(3)
    sim.finish(sim.end_object())


class _Head:
    """A compiled head variant."""

    __slots__ = ("pack_into", "c0", "c1", "c2", "size", "tok", "lora")

    def __init__(self, sim: _Sim, pattern: Sequence[str]) -> None:
        st, consts, var_consts, size = sim.compile(pattern)
        self.pack_into = st.pack_into
        self.c0 = consts[0]
        self.c1 = consts[1]
        self.c2 = consts[2] if len(consts) > 2 else b""
        self.size = size
        self.tok = var_consts.get("tok", 0)
        self.lora = var_consts.get("lora", 0)


def _stored_head(has_seq: bool, has_dp: bool, parent: bool, lora: bool, eagle: bool) -> _Head:
    # The block-hash vector's count was the last thing placed before StoredStart: offset 4 (mod 8), minalign 8.
    sim = _Sim(0, 8)
    sim.place(4, _Var("nh", "I"))
    hashes = sim.off
    sim.start_object(5)
    if parent:
        sim.prepend("Q", _Var("parent", "Q"))
        sim.slot(0)
    sim.prepend_uoffset(hashes)
    sim.slot(1)
    sim.prepend_uoffset_var("tok")
    sim.slot(2)
    if lora:
        sim.prepend_uoffset_var("lora")
        sim.slot(3)
    if eagle:
        sim.prepend("B", 1)
        sim.slot(4)
    _event(sim, sim.end_object(), KIND_STORED, has_seq, has_dp)
    return _Head(sim, _STORED_PATTERN)


def _removed_head(has_seq: bool, has_dp: bool) -> _Head:
    sim = _Sim(0, 8)
    sim.place(4, _Var("nh", "I"))
    hashes = sim.off
    sim.start_object(1)
    sim.prepend_uoffset(hashes)
    sim.slot(0)
    _event(sim, sim.end_object(), KIND_REMOVED, has_seq, has_dp)
    return _Head(sim, _REMOVED_PATTERN)


def _cleared_head(has_seq: bool, has_dp: bool) -> _Head:
    sim = _Sim(0, 1)
    sim.start_object(0)
    _event(sim, sim.end_object(), KIND_CLEARED, has_seq, has_dp)
    return _Head(sim, _CLEARED_PATTERN)


def _bits(i: int) -> tuple[bool, ...]:
    return tuple(bool(i >> b & 1) for b in range(5))


# Variant index: bit 0 seq != 0, bit 1 dp_rank != 0, bit 2 parent present, bit 3 LoRA, bit 4 Eagle.
_STORED: Final = tuple(_stored_head(*_bits(i)) for i in range(32))
_REMOVED: Final = tuple(_removed_head(*_bits(i)[:2]) for i in range(4))
_CLEARED: Final = tuple(_cleared_head(*_bits(i)[:2]) for i in range(4))

_TOKEN_COUNT = (struct.Struct("<I").pack_into, struct.Struct("<4xI").pack_into)  # index: 0 or 4 pad bytes first
_LORA_CACHE: dict[str, bytes] = {}
_LORA_CACHE_MAX: Final = 256


def _lora_chunk(name: str) -> bytes:
    """The string as the builder writes it: u32 length, UTF-8 bytes, NUL, zero padding to a multiple of 4."""
    chunk = _LORA_CACHE.get(name)
    if chunk is None:
        if not isinstance(name, str):
            raise TypeError(f"kvshm: lora_name must be a str or None, not {type(name).__name__}")
        try:
            raw = name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"kvshm: lora_name is not encodable as UTF-8: {e}") from None
        chunk = struct.pack("<I", len(raw)) + raw + bytes(1 + (-(len(raw) + 1) & 3))
        if len(_LORA_CACHE) >= _LORA_CACHE_MAX:
            _LORA_CACHE.clear()
        _LORA_CACHE[name] = chunk
    return chunk


_BYTE_FORMATS: Final = frozenset({"B", "b", "c"})


def _int_list(values: object, what: str) -> list[Any]:
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


def _from_buffer(values: object, typecode: str, formats: frozenset[str], itemsize: int) -> array[int] | None:
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


def _u64_slow(values: list[Any], what: str) -> array[int]:
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


def _u64_array(values: object, what: str) -> array[int]:
    """The u64 bytes of values as an array: array('Q') for [0, 2**64), else array('q') for [-2**63, 2**63) (its bytes
    are exactly the two's complement u64s; engines hash with signed 64-bit integers), else a Python loop (a list
    mixing negatives with values >= 2**63, or errors). Non-lists: a buffer of 8-byte integers (an int64 or uint64
    numpy array) is copied as it is, anything else goes through :func:`_int_list` first."""
    if values.__class__ is not list:
        out = _from_buffer(values, "Q", _U64_BYTES_FORMATS, 8)
        if out is not None:
            return out
    items = _int_list(values, what)
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
        return _u64_slow(items, what)


def _seq_dp(seq: object, dp_rank: object) -> tuple[int, int]:
    """seq and dp_rank as ints (operator.index: int subclasses and numpy integers pass, None/float/str do not).
    Ranges are left to the writer's pack_into (see check_seq_dp)."""
    try:
        return operator.index(seq), operator.index(dp_rank)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"kvshm: seq and dp_rank must be integers, not {type(seq).__name__}, {type(dp_rank).__name__}"
        ) from None


def _u32_array(values: object) -> array[int]:
    """array('I', values) for values that array.fromlist refused (not a list, or bad items); a buffer of u32 (a
    uint32 numpy array) is copied as it is."""
    if values.__class__ is not list:
        fast = _from_buffer(values, "I", _U32_BYTES_FORMATS, 4)
        if fast is not None:
            return fast
    out = array("I")
    try:
        out.fromlist(_int_list(values, "token ids"))
    except OverflowError:
        raise ValueError("kvshm: token ids must be in [0, 2**32)") from None
    except TypeError as e:
        raise TypeError(f"kvshm: token ids must be integers: {e}") from None
    return out


def _u64(value: object, what: str) -> int:
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


def _pack_error(p: Prepared, e: struct.error) -> Exception:
    """The error to raise when packing a prepared event failed: only seq and dp_rank are left unchecked."""
    check_seq_dp(p[3], p[4])
    return ValueError(f"kvshm: cannot encode the event: {e}")


# --------------------------------------------------------------------------------------------------------------
# Stored
#
# Prepared tuples of every kind start with (size, writer, head, seq, dp_rank); seq and dp_rank are validated by the
# writer's pack_into (see check_seq_dp).


def _write_stored(buf: Buffer, off: int, p: Prepared) -> None:
    size, _, head, seq, dp, parent, hashes, nh, tokens, nt, lora, gap = p
    try:
        head.pack_into(
            buf, off, size + 8, head.c0, dp or b"", seq or b"", head.c1,
            head.lora + gap + 4 * nt + 4 if lora else b"", head.tok + gap, head.c2,
            b"" if parent is None else parent, nh,
        )
    except struct.error as e:
        raise _pack_error(p, e) from None
    pos = off + 8 + head.size
    end = pos + 8 * nh
    buf[pos:end] = hashes
    pad = gap - 8 * nh  # 0 or 4 zero bytes before the token count
    _TOKEN_COUNT[pad >> 2](buf, end, nt)
    pos = end + pad + 4
    end = pos + 4 * nt
    buf[pos:end] = tokens
    if lora:
        buf[end : end + len(lora)] = lora


def prepare_stored(
    seq: SupportsIndex,
    token_ids: IntSequence,
    block_hashes: IntSequence,
    parent_hash: SupportsIndex | None,
    dp_rank: SupportsIndex,
    lora_name: str | None,
    is_eagle: bool,
) -> Prepared:
    """Validates and converts a Stored event; returns ``(size, writer, ...)`` (see the module docstring)."""
    # array.fromlist is ~30% faster than array(typecode, list) (no per-item sequence protocol), and leaves the
    # array unchanged on error.
    tokens = array("I")
    try:
        tokens.fromlist(token_ids)  # type: ignore[arg-type]
    except (OverflowError, TypeError):
        tokens = _u32_array(token_ids)  # not a list, or raises with a message
    hashes = array("Q")
    try:
        hashes.fromlist(block_hashes)  # type: ignore[arg-type]
    except (OverflowError, TypeError):
        hashes = _u64_array(block_hashes, "block hashes")  # signed hashes, not a list, or errors
    if seq.__class__ is not int or dp_rank.__class__ is not int:
        seq, dp_rank = _seq_dp(seq, dp_rank)  # `seq or b""` below must not see None or 0.0
    key = 1 if seq else 0
    if dp_rank:
        key |= 2
    if parent_hash is not None:
        key |= 4
        if parent_hash.__class__ is not int or not 0 <= parent_hash <= U64_MAX:
            parent_hash = _u64(parent_hash, "parent_hash")
    lora = b""
    if lora_name:
        key |= 8
        lora = _LORA_CACHE.get(lora_name) or _lora_chunk(lora_name)
    if is_eagle:
        key |= 16
    head = _STORED[key]
    nh = len(hashes)
    nt = len(tokens)
    # Zero bytes the builder puts between the hash data and the token count (0 or 4), plus the hash data.
    gap = 8 * nh + ((len(lora) + 4 * nt + 4) & 4)
    return (head.size + gap + 4 + 4 * nt + len(lora), _write_stored, head, seq, dp_rank, parent_hash, hashes, nh,
            tokens, nt, lora, gap)


# --------------------------------------------------------------------------------------------------------------
# Removed and Cleared


def _write_removed(buf: Buffer, off: int, p: Prepared) -> None:
    size, _, head, seq, dp, hashes, nh = p
    try:
        head.pack_into(buf, off, size + 8, head.c0, dp or b"", seq or b"", head.c1, nh)
    except struct.error as e:
        raise _pack_error(p, e) from None
    pos = off + 8 + head.size
    buf[pos : pos + 8 * nh] = hashes


def prepare_removed(seq: SupportsIndex, block_hashes: IntSequence, dp_rank: SupportsIndex) -> Prepared:
    """Validates and converts a Removed event; returns ``(size, writer, ...)``."""
    hashes = array("Q")
    try:
        hashes.fromlist(block_hashes)  # type: ignore[arg-type]
    except (OverflowError, TypeError):
        hashes = _u64_array(block_hashes, "block hashes")  # not a list, or out of range
    if seq.__class__ is not int or dp_rank.__class__ is not int:
        seq, dp_rank = _seq_dp(seq, dp_rank)
    head = _REMOVED[(1 if seq else 0) | (2 if dp_rank else 0)]
    nh = len(hashes)
    return (head.size + 8 * nh, _write_removed, head, seq, dp_rank, hashes, nh)


def _write_cleared(buf: Buffer, off: int, p: Prepared) -> None:
    size, _, head, seq, dp = p
    try:
        head.pack_into(buf, off, size + 8, head.c0, dp or b"", seq or b"", head.c1)
    except struct.error as e:
        raise _pack_error(p, e) from None


def prepare_cleared(seq: SupportsIndex, dp_rank: SupportsIndex) -> Prepared:
    """Validates a Cleared event; returns ``(size, writer, ...)``."""
    if seq.__class__ is not int or dp_rank.__class__ is not int:
        seq, dp_rank = _seq_dp(seq, dp_rank)
    head = _CLEARED[(1 if seq else 0) | (2 if dp_rank else 0)]
    return (head.size, _write_cleared, head, seq, dp_rank)


# --------------------------------------------------------------------------------------------------------------
# Convenience: whole payloads as bytes.


def _to_bytes(p: Prepared) -> bytes:
    buf = bytearray(8 + p[0])
    p[1](buf, 0, p)
    return bytes(buf[8:])


def encode_stored(
    seq: SupportsIndex,
    token_ids: IntSequence,
    block_hashes: IntSequence,
    parent_hash: SupportsIndex | None = None,
    dp_rank: SupportsIndex = 0,
    lora_name: str | None = None,
    is_eagle: bool = False,
) -> bytes:
    """Returns the canonical FlatBuffer of a Stored event."""
    return _to_bytes(prepare_stored(seq, token_ids, block_hashes, parent_hash, dp_rank, lora_name, is_eagle))


def encode_removed(seq: SupportsIndex, block_hashes: IntSequence, dp_rank: SupportsIndex = 0) -> bytes:
    """Returns the canonical FlatBuffer of a Removed event."""
    return _to_bytes(prepare_removed(seq, block_hashes, dp_rank))


def encode_cleared(seq: SupportsIndex, dp_rank: SupportsIndex = 0) -> bytes:
    """Returns the canonical FlatBuffer of a Cleared event."""
    return _to_bytes(prepare_cleared(seq, dp_rank))


# --------------------------------------------------------------------------------------------------------------
# Event metadata (kvevent.Meta) and BATCH records (shm/FORMAT.md, "BATCH record").
#
# Meta is small and cached per distinct value, so it is built by a minimal FlatBuffers builder for one table (no
# runtime dependency) that follows the official builders' arithmetic and kvshm's canonical call order (Go:
# fbs.BuildMeta): [parent bytes = CreateByteVector], [hash bytes = CreateByteVector], [kind = CreateString],
# [extra = CreateByteVector], [medium = CreateString], MetaStart, the present fields in schema order, MetaEnd, Finish
# without file identifier. Tests prove byte identity with the official
# Python builder and with the shared vectors (testdata/batch) that the Go side checks too.

RECORD_BATCH: Final = 3  # ring record type of a batch
SUB_EVENT: Final = 1  # sub-record types inside a BATCH
SUB_META: Final = 4
BATCH_HEADER: Final = 16  # ts f64, count u32, flags u32

# Meta's vtable slots (proto/fbs/event.fbs): medium, lora_id, block_size, extra_keys, group_idx, kind, window,
# block_hash_bytes, parent_hash_bytes.
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
    b = _Sim(0, 1)  # the same builder arithmetic as the EVENT layouts, here with constant bytes only
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
