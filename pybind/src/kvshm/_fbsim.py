"""The FlatBuffers builder simulator behind kvshm's event encoder (:mod:`kvshm._encode`) and its Meta builder
(:mod:`kvshm._batchrec`): the official builders' Prep/Pad/vtable arithmetic, replayed once per layout variant.

How the layout is derived. A FlatBuffer is built back to front, and every alignment decision of the builder depends
only on the current offset modulo 8. The vectors are created before the tables; the block-hash vector always ends
(in build order) at an offset that is 4 modulo 8, because its u64 elements are 8-aligned and its u32 count follows.
So everything from the block-hash count down to the start of the buffer, the "head", has a layout that depends
only on which optional fields are present (seq != 0, dp_rank != 0, parent, LoRA, Eagle): 32 Stored variants, 4
Removed and 4 Cleared. At import, :class:`Sim` replays the canonical builder calls for each variant with the same
Prep/Pad/vtable arithmetic as the official builders, recording which bytes are constants and where the variable
fields go, and compiles the head into one Struct whose arguments always come in the same order (absent fields are
``0s`` slots fed ``b""``). Memory order of a Stored payload::

    head:   u32 root | "KVEV" | pad | Event vtable | Event table (soffset, data, type, [dp_rank], [seq])
            | Stored vtable | Stored table (soffset, [is_eagle], [lora], token_ids, block_hashes, [parent])
            | u32 block-hash count
    then:   count × u64 hashes | 0 or 4 zero bytes | u32 token count | count × u32 tokens
            | [u32 lora length | UTF-8 bytes | NUL | zero pad to 4]

Every padding byte is written (as zero): ring memory holds old records, and byte identity needs the zeros.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

__all__ = [
    "CLEARED_HEADS",
    "FILE_IDENTIFIER",
    "KIND_CLEARED",
    "KIND_REMOVED",
    "KIND_STORED",
    "RECORD_EVENT",
    "REMOVED_HEADS",
    "STORED_HEADS",
    "Head",
    "Sim",
]

KIND_STORED: Final = 1
KIND_REMOVED: Final = 2
KIND_CLEARED: Final = 3
RECORD_EVENT: Final = 1  # ring record type of an event (shm/FORMAT.md)
FILE_IDENTIFIER: Final = b"KVEV"


class Var:
    """A variable field of the head: its name, its struct code and (for vector offsets) a constant part."""

    __slots__ = ("name", "code", "const")

    def __init__(self, name: str, code: str, const: int = 0) -> None:
        self.name = name
        self.code = code
        self.const = const


class Run:
    """A run of the head in memory order: constant bytes (name "C") or one variable with its padding."""

    __slots__ = ("name", "data", "code", "const")

    def __init__(self, name: str, data: bytes, code: str = "", const: int = 0) -> None:
        self.name = name
        self.data = data
        self.code = code
        self.const = const


class Sim:
    """Replays FlatBuffers builder calls (offsets from the end of the buffer, as the builders count them),
    recording constant bytes and variable slots instead of writing a buffer."""

    def __init__(self, off: int, minalign: int) -> None:
        self.off = off
        self.minalign = minalign
        # (offset from the end at the item's *start in build order*, size, bytes | Var)
        self.items: list[tuple[int, int, bytes | Var]] = []
        self.vtable: list[int] = []
        self.object_end = 0

    def prep(self, size: int, additional: int) -> None:
        if size > self.minalign:
            self.minalign = size
        self.off += (-(self.off + additional)) & (size - 1)  # zero padding

    def place(self, size: int, value: bytes | Var) -> int:
        self.off += size
        self.items.append((self.off, size, value))
        return len(self.items) - 1

    def prepend(self, code: str, value: int | Var) -> None:
        size = struct.calcsize("<" + code)
        self.prep(size, 0)
        self.place(size, value if isinstance(value, Var) else struct.pack("<" + code, value))

    def prepend_uoffset(self, target: int) -> None:
        """A uoffset to an object at offset ``target`` (from the end) inside the head."""
        self.prep(4, 0)
        self.place(4, struct.pack("<I", self.off + 4 - target))

    def prepend_uoffset_var(self, name: str) -> None:
        """A uoffset to a vector beyond the head: its value is (offset of the field) + a runtime distance."""
        self.prep(4, 0)
        self.place(4, Var(name, "I", self.off + 4))

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
        """The finished buffer, when every item is constant (no Var): build_meta's whole-buffer use."""
        out = bytearray(self.off)
        for end, size, value in self.items:
            assert isinstance(value, bytes), "a Var has no bytes"
            out[self.off - end : self.off - end + size] = value
        return bytes(out)

    def compile(self, pattern: Sequence[str]) -> tuple[struct.Struct, tuple[bytes, ...], dict[str, int], int]:
        """Lays the items out in memory order and fits them to ``pattern``: "C" = a run of constant bytes
        (possibly empty), any other name = that variable (``0s`` when absent). Padding joins the item before it.
        Returns the Struct (with a leading u32 record length and the record type folded into the first constant),
        the constant chunks, the constant parts of the variables and the head size."""
        total = self.off
        layout: list[tuple[int, int, bytes | Var]] = sorted(
            ((total - end, size, value) for end, size, value in self.items), key=lambda t: t[0]
        )
        runs: list[Run] = [Run("C", struct.pack("<I", RECORD_EVENT))]
        pos = 0
        for start, size, value in layout:
            gap = start - pos
            assert gap >= 0, "overlapping items"
            if gap:  # zero padding belongs to the previous run
                if runs[-1].name == "C":
                    runs[-1].data += bytes(gap)
                else:
                    runs[-1].code += "x" * gap
            if isinstance(value, Var):
                runs.append(Run(value.name, b"", value.code, value.const))
            elif runs[-1].name == "C":
                runs[-1].data += value
            else:
                runs.append(Run("C", value))
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


def _event(sim: Sim, data: int, kind: int, has_seq: bool, has_dp: bool) -> None:
    """EventStart, AddSeq, AddDpRank, AddDataType, AddData, EventEnd, Finish(KVEV)."""
    sim.start_object(4)
    if has_seq:
        sim.prepend("Q", Var("seq", "Q"))
        sim.slot(0)
    if has_dp:
        sim.prepend("I", Var("dp", "I"))
        sim.slot(1)
    sim.prepend("B", kind)
    sim.slot(2)
    sim.prepend_uoffset(data)
    sim.slot(3)
    sim.finish(sim.end_object())


class Head:
    """A compiled head variant."""

    __slots__ = ("pack_into", "c0", "c1", "c2", "size", "tok", "lora")

    def __init__(self, sim: Sim, pattern: Sequence[str]) -> None:
        st, consts, var_consts, size = sim.compile(pattern)
        self.pack_into = st.pack_into
        self.c0 = consts[0]
        self.c1 = consts[1]
        self.c2 = consts[2] if len(consts) > 2 else b""
        self.size = size
        self.tok = var_consts.get("tok", 0)
        self.lora = var_consts.get("lora", 0)


def _stored_head(has_seq: bool, has_dp: bool, parent: bool, lora: bool, eagle: bool) -> Head:
    # The block-hash vector's count was the last thing placed before StoredStart: offset 4 (mod 8), minalign 8.
    sim = Sim(0, 8)
    sim.place(4, Var("nh", "I"))
    hashes = sim.off
    sim.start_object(5)
    if parent:
        sim.prepend("Q", Var("parent", "Q"))
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
    return Head(sim, _STORED_PATTERN)


def _removed_head(has_seq: bool, has_dp: bool) -> Head:
    sim = Sim(0, 8)
    sim.place(4, Var("nh", "I"))
    hashes = sim.off
    sim.start_object(1)
    sim.prepend_uoffset(hashes)
    sim.slot(0)
    _event(sim, sim.end_object(), KIND_REMOVED, has_seq, has_dp)
    return Head(sim, _REMOVED_PATTERN)


def _cleared_head(has_seq: bool, has_dp: bool) -> Head:
    sim = Sim(0, 1)
    sim.start_object(0)
    _event(sim, sim.end_object(), KIND_CLEARED, has_seq, has_dp)
    return Head(sim, _CLEARED_PATTERN)


def _bits(i: int) -> tuple[bool, ...]:
    return tuple(bool(i >> b & 1) for b in range(5))


# Variant index: bit 0 seq != 0, bit 1 dp_rank != 0, bit 2 parent present, bit 3 LoRA, bit 4 Eagle.
STORED_HEADS: Final = tuple(_stored_head(*_bits(i)) for i in range(32))
REMOVED_HEADS: Final = tuple(_removed_head(*_bits(i)[:2]) for i in range(4))
CLEARED_HEADS: Final = tuple(_cleared_head(*_bits(i)[:2]) for i in range(4))
