"""The fast encoder against the official Python builder, the shared vectors and the generated reader.

Run: PYTHONPATH=pybind/src .venv/bin/python -m pytest pybind/tests/test_encode.py
"""

from __future__ import annotations

import json
import os
import random
from array import array
from pathlib import Path
from typing import Any

import flatbuffers
import pytest

from kvshm import _encode
from kvshm._fbs.kvevent import Cleared, Event, EventData, Removed, Stored

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "testdata" / "events"


def official(ev: dict[str, Any]) -> bytes:
    """The canonical builder call order (proto/fbs/codec.go) with the official Python builder."""
    b = flatbuffers.Builder(0)
    kind = ev["kind"]
    if kind == "stored":
        lora = None
        if ev["lora_name"]:
            lora = b.CreateString(ev["lora_name"])
        Stored.StoredStartTokenIdsVector(b, len(ev["token_ids"]))
        for t in reversed(ev["token_ids"]):
            b.PrependUint32(t)
        tokens = b.EndVector()
        Stored.StoredStartBlockHashesVector(b, len(ev["block_hashes"]))
        for h in reversed(ev["block_hashes"]):
            b.PrependUint64(h)
        hashes = b.EndVector()
        Stored.StoredStart(b)
        if ev["parent_hash"] is not None:
            Stored.StoredAddParentHash(b, ev["parent_hash"])
        Stored.StoredAddBlockHashes(b, hashes)
        Stored.StoredAddTokenIds(b, tokens)
        if lora is not None:
            Stored.StoredAddLoraName(b, lora)
        if ev["is_eagle"]:
            Stored.StoredAddIsEagle(b, True)
        data = Stored.StoredEnd(b)
        dtype = EventData.EventData.Stored
    elif kind == "removed":
        Removed.RemovedStartBlockHashesVector(b, len(ev["block_hashes"]))
        for h in reversed(ev["block_hashes"]):
            b.PrependUint64(h)
        hashes = b.EndVector()
        Removed.RemovedStart(b)
        Removed.RemovedAddBlockHashes(b, hashes)
        data = Removed.RemovedEnd(b)
        dtype = EventData.EventData.Removed
    else:
        Cleared.ClearedStart(b)
        data = Cleared.ClearedEnd(b)
        dtype = EventData.EventData.Cleared
    Event.EventStart(b)
    Event.EventAddSeq(b, ev["seq"])
    Event.EventAddDpRank(b, ev["dp_rank"])
    Event.EventAddDataType(b, dtype)
    Event.EventAddData(b, data)
    b.Finish(Event.EventEnd(b), file_identifier=b"KVEV")
    return bytes(b.Output())


def fast(ev: dict[str, Any]) -> bytes:
    if ev["kind"] == "stored":
        return _encode.encode_stored(
            ev["seq"], ev["token_ids"], ev["block_hashes"], ev["parent_hash"], ev["dp_rank"], ev["lora_name"],
            ev["is_eagle"],
        )
    if ev["kind"] == "removed":
        return _encode.encode_removed(ev["seq"], ev["block_hashes"], ev["dp_rank"])
    return _encode.encode_cleared(ev["seq"], ev["dp_rank"])


def read_back(buf: bytes) -> dict[str, Any]:
    """Decodes through the generated reader into the JSON vector shape."""
    assert Event.Event.EventBufferHasIdentifier(buf, 0)
    e = Event.Event.GetRootAs(buf, 0)
    table = e.Data()
    assert table is not None, "required data missing"
    out: dict[str, Any] = {"seq": e.Seq(), "dp_rank": e.DpRank(), "parent_hash": None, "block_hashes": [],
                           "token_ids": [], "lora_name": None, "is_eagle": False}
    if e.DataType() == EventData.EventData.Stored:
        s = Stored.Stored()
        s.Init(table.Bytes, table.Pos)
        out.update(kind="stored", parent_hash=s.ParentHash(),
                   block_hashes=[s.BlockHashes(i) for i in range(s.BlockHashesLength())],
                   token_ids=[s.TokenIds(i) for i in range(s.TokenIdsLength())],
                   lora_name=s.LoraName().decode() if s.LoraName() is not None else None, is_eagle=s.IsEagle())
    elif e.DataType() == EventData.EventData.Removed:
        r = Removed.Removed()
        r.Init(table.Bytes, table.Pos)
        out.update(kind="removed", block_hashes=[r.BlockHashes(i) for i in range(r.BlockHashesLength())])
    else:
        assert e.DataType() == EventData.EventData.Cleared
        out["kind"] = "cleared"
    return out


def normalized(ev: dict[str, Any]) -> dict[str, Any]:
    """What a reader sees: an empty LoRA name is absent; Removed/Cleared carry no Stored fields."""
    out = dict(ev)
    if not out["lora_name"]:
        out["lora_name"] = None
    if out["kind"] != "stored":
        out.update(parent_hash=None, token_ids=[], lora_name=None, is_eagle=False)
    if out["kind"] == "cleared":
        out["block_hashes"] = []
    return out


def vector_names() -> list[str]:
    return sorted(p.stem for p in VECTORS.glob("*.json"))


def test_vectors_exist() -> None:
    names = vector_names()
    assert len(names) >= 10, f"expected the shared vectors in {VECTORS}, found {names}"
    for n in ("stored_root", "stored_parent", "stored_lora", "stored_eagle", "stored_defaults", "stored_large",
              "stored_empty", "stored_32x32", "removed", "removed_empty", "cleared"):
        assert n in names, f"vector {n} missing"


@pytest.mark.parametrize("name", vector_names())
def test_vector_bytes(name: str) -> None:
    ev = json.loads((VECTORS / f"{name}.json").read_text())
    want = (VECTORS / f"{name}.bin").read_bytes()
    assert official(ev) == want, "official Python builder differs from the Go builder's .bin"
    assert fast(ev) == want, "fast encoder differs from the .bin"
    assert read_back(want) == normalized(ev)


def random_event(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["stored", "removed", "cleared"])
    big = rng.random() < 0.3
    ev: dict[str, Any] = {
        "kind": kind,
        "seq": rng.choice([0, rng.getrandbits(64) if big else rng.randrange(1, 1000)]),
        "dp_rank": rng.choice([0, rng.getrandbits(32) if big else rng.randrange(1, 8)]),
        "parent_hash": None, "block_hashes": [], "token_ids": [], "lora_name": None, "is_eagle": False,
    }
    if kind == "cleared":
        return ev
    ev["block_hashes"] = [rng.getrandbits(64) for _ in range(rng.choice([0, 1, 2, 3, rng.randrange(0, 70)]))]
    if kind == "removed":
        return ev
    ev["token_ids"] = [rng.getrandbits(32) for _ in range(rng.choice([0, 1, 2, 3, rng.randrange(0, 300)]))]
    ev["parent_hash"] = rng.choice([None, 0, rng.getrandbits(64)])
    ev["lora_name"] = rng.choice([None, "", "a" * rng.randrange(1, 12), "lora-ü" * rng.randrange(1, 3)])
    ev["is_eagle"] = rng.random() < 0.5
    return ev


def test_random_against_official_builder() -> None:
    seed = int(os.environ.get("KVSHM_TEST_SEED", random.randrange(1 << 32)))
    rng = random.Random(seed)
    for i in range(600):
        ev = random_event(rng)
        want = official(ev)
        got = fast(ev)
        assert got == want, f"seed {seed} event {i}: fast encoder differs for {ev}"
        assert read_back(got) == normalized(ev), f"seed {seed} event {i}"


def test_every_stored_variant() -> None:
    """All 32 head variants (seq, dp_rank, parent, LoRA, Eagle) × token-count parities × LoRA lengths."""
    for bits in range(32):
        for nt in (0, 1, 2, 5):
            for lora in ("x", "abc", "abcd"):
                ev = {"kind": "stored", "seq": 9 if bits & 1 else 0, "dp_rank": 3 if bits & 2 else 0,
                      "parent_hash": 77 if bits & 4 else None, "block_hashes": [1, 2][: nt % 3],
                      "token_ids": list(range(nt)), "lora_name": lora if bits & 8 else None,
                      "is_eagle": bool(bits & 16)}
                assert fast(ev) == official(ev), ev


def test_writes_into_dirty_buffer_at_offset() -> None:
    """Every padding byte is written: a buffer full of old bytes gives the same payload and record header."""
    rng = random.Random(7)
    for _ in range(200):
        ev = random_event(rng)
        want = official(ev)
        if ev["kind"] == "stored":
            p = _encode.prepare_stored(ev["seq"], ev["token_ids"], ev["block_hashes"], ev["parent_hash"],
                                       ev["dp_rank"], ev["lora_name"], ev["is_eagle"])
        elif ev["kind"] == "removed":
            p = _encode.prepare_removed(ev["seq"], ev["block_hashes"], ev["dp_rank"])
        else:
            p = _encode.prepare_cleared(ev["seq"], ev["dp_rank"])
        assert p[0] == len(want)
        buf = bytearray(b"\xa5" * (64 + 8 + p[0] + 64))
        p[1](buf, 64, p)
        assert buf[:64] == b"\xa5" * 64 and buf[72 + p[0]:] == b"\xa5" * 64, "wrote outside the record"
        assert int.from_bytes(buf[64:68], "little") == 8 + len(want)
        assert int.from_bytes(buf[68:72], "little") == _encode.RECORD_EVENT
        assert bytes(buf[72:72 + p[0]]) == want


def test_negative_hashes_are_twos_complement() -> None:
    a = _encode.encode_stored(1, [1, 2], [-1, -(1 << 63)], -2, 0, None, False)
    b = _encode.encode_stored(1, [1, 2], [(1 << 64) - 1, 1 << 63], (1 << 64) - 2, 0, None, False)
    assert a == b
    assert _encode.encode_removed(1, [-5]) == _encode.encode_removed(1, [(1 << 64) - 5])


def test_signed_and_mixed_hashes() -> None:
    """Signed hashes take the array('q') path, a mix of negatives and values >= 2**63 the slow path: same bytes."""
    rng = random.Random(3)
    unsigned = [rng.getrandbits(64) for _ in range(40)]
    signed = [h - (1 << 64) if h >= 1 << 63 else h for h in unsigned]
    mixed = [h if i % 2 else s for i, (h, s) in enumerate(zip(unsigned, signed))]
    want = _encode.encode_stored(5, [1], unsigned, unsigned[0], 0, None, False)
    assert any(h < 0 for h in signed) and any(h >= 1 << 63 for h in mixed) and any(h < 0 for h in mixed)
    for hashes in (signed, mixed, tuple(signed), tuple(mixed)):
        assert _encode.encode_stored(5, [1], hashes, signed[0], 0, None, False) == want
    assert _encode.encode_removed(5, signed) == _encode.encode_removed(5, unsigned)


class Index:
    """An integer-like object (as numpy integers are)."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_index_types_for_seq_and_dp() -> None:
    assert _encode.encode_cleared(Index(7), Index(2)) == _encode.encode_cleared(7, 2)  # type: ignore[arg-type]
    assert _encode.encode_removed(True, [1], False) == _encode.encode_removed(1, [1], 0)
    assert _encode.encode_stored(Index(0), [1], [2], None, Index(0)) == _encode.encode_stored(0, [1], [2], None, 0)  # type: ignore[arg-type]


def test_sequences_are_accepted() -> None:
    """Any sequence of integers: tuples, ranges, array.array, typed memoryviews, items with __index__."""
    want = _encode.encode_stored(1, [1, 2, 3], [4, 5], None)
    assert _encode.encode_stored(1, (1, 2, 3), (4, 5), None) == want
    assert _encode.encode_stored(1, range(1, 4), array("q", [4, 5]), None) == want
    assert _encode.encode_stored(1, array("I", [1, 2, 3]), memoryview(array("Q", [4, 5])), None) == want
    assert _encode.encode_stored(1, [Index(1), 2, Index(3)], [Index(4), 5], None) == want
    assert _encode.encode_stored(1, range(1, 4), (-1,), None) == _encode.encode_stored(1, [1, 2, 3], [U64], None)
    # the slow path (a list mixing negatives and values >= 2**63) takes integer-likes too
    assert _encode.encode_removed(1, [Index(-1), 1 << 63]) == _encode.encode_removed(1, [U64, 1 << 63])
    assert _encode.encode_stored(1, [], [], Index(-2)) == _encode.encode_stored(1, [], [], U64 - 1)


@pytest.mark.parametrize(
    "values",
    [b"ab", bytearray(b"ab"), memoryview(b"ab"), "ab", {1: 2}, {1, 2}, iter([1, 2]), (v for v in [1, 2]), 5, None],
    ids=["bytes", "bytearray", "byte-memoryview", "str", "dict", "set", "iterator", "generator", "int", "None"],
)
def test_non_sequences_are_refused(values: Any) -> None:
    """What Python would iterate into small ints (raw bytes, a dict's keys) or may only iterate once is refused,
    as token ids and as hashes, with TypeError."""
    with pytest.raises(TypeError, match="kvshm"):
        _encode.encode_stored(1, values, [1], None)
    with pytest.raises(TypeError, match="kvshm"):
        _encode.encode_stored(1, [1], values, None)
    with pytest.raises(TypeError, match="kvshm"):
        _encode.encode_removed(1, values)


U64 = (1 << 64) - 1


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda: _encode.encode_stored(-1, [], [], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1 << 64, [], [], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [], [], None, -1, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [], [], None, 1 << 32, None, False), ValueError),
        (lambda: _encode.encode_stored(1.0, [], [], None, 0, None, False), TypeError),
        (lambda: _encode.encode_stored(1, [1 << 32], [], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [-1], [], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [1.5], [], None, 0, None, False), TypeError),
        (lambda: _encode.encode_stored(1, [], [1 << 64], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [], [-(1 << 63) - 1], None, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [], ["x"], None, 0, None, False), TypeError),
        (lambda: _encode.encode_stored(1, [], [], 1 << 64, 0, None, False), ValueError),
        (lambda: _encode.encode_stored(1, [], [], "p", 0, None, False), TypeError),
        (lambda: _encode.encode_stored(1, [], [], None, 0, b"lora", False), TypeError),
        (lambda: _encode.encode_stored(1, [], [], None, 0, "\ud800", False), ValueError),
        (lambda: _encode.encode_removed(1, [1 << 64], 0), ValueError),
        (lambda: _encode.encode_cleared(1 << 64, 0), ValueError),
        (lambda: _encode.encode_cleared(0, -1), ValueError),
        (lambda: _encode.encode_cleared(None, 0), TypeError),
        (lambda: _encode.encode_cleared(0.0, 0), TypeError),
        (lambda: _encode.encode_removed(1, [], None), TypeError),
        (lambda: _encode.encode_stored(1, [], [], None, 0.0, None, False), TypeError),
    ],
)
def test_invalid_arguments(call: Any, exc: type[Exception]) -> None:
    with pytest.raises(exc, match="kvshm"):
        call()
