"""BATCH records: the Python encoder against the shared vectors in testdata/batch, which the Go side
(shm/batch_vectors_test.go: shm.Record.Batch + fbs.Decode/DecodeMeta, and its own writer) checks too, and the
Meta builder against the official FlatBuffers builder.

Regenerate the vectors (after a deliberate format change only): KVSHM_UPDATE_VECTORS=1 pytest pybind/tests/test_batch.py
"""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from kvshm import events as ke
from kvshm._batch import BatchBuilder
from kvshm._batchrec import RECORD_BATCH, SUB_EVENT, SUB_META, build_meta, prepare_batch
from kvshm._encode import encode_cleared, encode_removed, encode_stored

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "testdata" / "batch"

# name -> (seq, dp_rank, ts, kv_block_size, events)
CASES: dict[str, tuple[int, int, float, int, list[Any]]] = {
    "gpu_stored": (5, 0, 1700000000.25, 4, [
        ke.BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None),
    ]),
    "mixed": (7, 1, 0.0, 4, [
        ke.BlockStored([21], 11, [1, 2, 3, 4], 4, None, None, None),
        ke.BlockRemoved([21, 2**64 - 1], "GPU"),
        ke.AllBlocksCleared(),
        ke.BlockStored([22], None, [9, 9, 9, 9], 4, None, "GPU", "lora-a"),
    ]),
    "full_meta": (2**63 + 5, 3, 1.5, 4, [
        ke.BlockStored([31, 32], 30, list(range(100, 116)), 8, -3, "CPU", "lora-x",
                       extra_keys=[("lora-x", ("mm", "abc", 0)), None], group_idx=1,
                       kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128),
        ke.BlockRemoved([31], "CPU", group_idx=2),
    ]),
    "eagle_pairs": (9, 0, 2.0, 2, [
        ke.BlockStored([41, 42], None, [(1, 2), (2, 3), (3, 4), (4, 5)], 2, None, "GPU", None),  # type: ignore[list-item]
    ]),
    "bytes_hashes": (11, 2, 4.0, 2, [  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: sha256-sized bytes hashes
        ke.BlockStored([b"\x01" * 32, b"\x02" * 32], b"\x03" * 32, [1, 2, 3, 4], 2, None, "GPU", None),
        ke.BlockRemoved([b"\xab\xcd"], "GPU"),
        ke.BlockStored([b"\x04" * 32], None, [5, 6], 2, None, "CPU", None, group_idx=1),
    ]),
    "empty_medium": (10, 0, 3.0, 4, [
        ke.BlockRemoved([5], ""),
        ke.BlockStored([6], None, [0, 0, 0, 0], 4, 0, None, None, group_idx=0),
    ]),
}


def record_of(seq: int, dp: int, ts: float, kv_bs: int, evs: list[Any]) -> bytes:
    subs, _ = BatchBuilder(kv_bs).subs(seq, dp, evs)
    p = prepare_batch(seq, dp, ts, subs)
    buf = bytearray(b"\xee" * (8 + p[0] + 8))  # stale bytes around, as in a ring
    p[1](buf, 0, p)
    assert buf[8 + p[0]:] == b"\xee" * 8, "wrote past the record"
    return bytes(buf[: 8 + p[0]])


def event_json(e: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(e).__name__}
    for f in getattr(e, "__dataclass_fields__", {}):
        v = getattr(e, f)
        if f == "extra_keys" and v is not None:
            import msgspec

            d["extra_keys_msgpack"] = msgspec.msgpack.encode(v).hex()
            continue
        if f == "block_hashes" and v and isinstance(v[0], bytes):  # JSON has no bytes: their keys and hex
            d["block_hash_bytes_hex"] = b"".join(v).hex()
            v = [int.from_bytes(h[-8:], "big") for h in v]
        if f == "parent_block_hash" and isinstance(v, bytes):
            d["parent_bytes_hex"] = v.hex()
            v = int.from_bytes(v[-8:], "big")
        d[f] = v
    return d


def test_vectors() -> None:
    if os.environ.get("KVSHM_UPDATE_VECTORS"):
        VECTORS.mkdir(parents=True, exist_ok=True)
        for name, (seq, dp, ts, kv_bs, evs) in CASES.items():
            doc = {
                "seq": seq, "dp_rank": dp, "ts": ts, "kv_block_size": kv_bs,
                "events": [event_json(e) for e in evs],
                "record": record_of(seq, dp, ts, kv_bs, evs).hex(),
            }
            (VECTORS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    names = sorted(p.stem for p in VECTORS.glob("*.json"))
    assert names == sorted(CASES), f"testdata/batch holds {names}; regenerate with KVSHM_UPDATE_VECTORS=1"
    for name, (seq, dp, ts, kv_bs, evs) in CASES.items():
        doc = json.loads((VECTORS / f"{name}.json").read_text())
        assert record_of(seq, dp, ts, kv_bs, evs).hex() == doc["record"], name


def parse(rec: bytes) -> tuple[float, list[tuple[int, bytes]]]:
    """A straightforward reader of a BATCH record (shm/FORMAT.md), independent of the writer."""
    length, typ = struct.unpack_from("<II", rec)
    assert typ == RECORD_BATCH and length == len(rec)
    ts, count, flags = struct.unpack_from("<dII", rec, 8)
    assert flags == 0
    off, subs = 24, []
    for i in range(count):
        n, t = struct.unpack_from("<II", rec, off)
        subs.append((t, rec[off + 8: off + n]))
        off += n if i == count - 1 else (n + 7) & ~7
        if i != count - 1:
            assert rec[off - ((-n) & 7): off] == bytes((-n) & 7), "padding not zero"
    assert off == len(rec)
    return ts, subs


def test_layout_matches_single_event_encoding() -> None:
    """EVENT sub-records are byte-identical to the single-event encoder's payloads; META only where needed."""
    seq, dp, ts, kv_bs, evs = CASES["mixed"]
    got_ts, subs = parse(record_of(seq, dp, ts, kv_bs, evs))
    assert got_ts == ts
    assert subs == [
        (SUB_META, build_meta()),  # medium None: an empty Meta (no META would mean medium "GPU")
        (SUB_EVENT, encode_stored(seq, [1, 2, 3, 4], [21], 11, dp)),
        (SUB_EVENT, encode_removed(seq, [21, 2**64 - 1], dp)),  # medium "GPU": the defaults, no META
        (SUB_EVENT, encode_cleared(seq, dp)),
        (SUB_EVENT, encode_stored(seq, [9, 9, 9, 9], [22], None, dp, "lora-a")),
    ]
    # Eagle pairs are Dynamo's bigram form: the first of each pair, then the last's second.
    seq, dp, ts, kv_bs, evs = CASES["eagle_pairs"]
    _, subs = parse(record_of(seq, dp, ts, kv_bs, evs))
    assert subs[0] == (SUB_EVENT, encode_stored(seq, [1, 2, 3, 4, 5], [41, 42], None, dp, None, True))
    # block_size goes into Meta only when it differs from the stream's.
    seq, dp, ts, kv_bs, evs = CASES["full_meta"]
    _, subs = parse(record_of(seq, dp, ts, kv_bs, evs))
    import msgspec

    assert subs[0] == (SUB_META, build_meta("CPU", -3, 8, msgspec.msgpack.encode(evs[0].extra_keys), 1,
                                            "sliding_window", 128))
    assert subs[2] == (SUB_META, build_meta("CPU", group_idx=2))


def test_meta_cache_and_errors() -> None:
    b = BatchBuilder(4)
    e = ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None)
    s1, n1 = b.subs(1, 0, [e])
    s2, n2 = b.subs(2, 0, [e])
    assert n1 == n2 == 0 and len(s1) == 1, "the common case (medium GPU only) needs no META"
    e = ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "CPU", None)
    s1, n1 = b.subs(1, 0, [e])
    s2, n2 = b.subs(2, 0, [e])
    assert n1 == n2 == 1 and s1[0] is s2[0], "Meta bytes are cached per value"
    with pytest.raises(TypeError, match="not Foo"):
        b.subs(1, 0, [type("Foo", (), {})()])
    with pytest.raises(TypeError):
        b.subs(1, 0, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, "x", "GPU", None)])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        b.subs(1, 0, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None, group_idx=-1)])
    with pytest.raises(TypeError):
        b.subs(1, 0, [ke.BlockRemoved([1], 5)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="msgspec"):
        b.subs(1, 0, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None, extra_keys=[object()])])  # type: ignore[list-item]
    assert b.fields_dropped == 0
    b.subs(1, 0, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None, session_id="s"),
                  ke.BlockRemoved([1], None, locality="LOCAL")])
    assert b.fields_dropped == 2
    # SGLang's wire carries session_id and cache_salt in Meta: nothing dropped.
    sg = BatchBuilder(4, "sglang")
    subs, n = sg.subs(1, 0, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None, session_id="s")])
    assert sg.fields_dropped == 0 and n == 1 and subs[0] == build_meta("GPU", session_id="s")


def official_meta(**kw: Any) -> bytes:
    flatbuffers = pytest.importorskip("flatbuffers")
    from kvshm._fbs.kvevent import Meta as generated

    Meta: Any = generated  # flatc's Python is untyped
    b = flatbuffers.Builder(0)
    ss = b.CreateString(kw["session_id"]) if kw.get("session_id") is not None else None
    cs = b.CreateString(kw["cache_salt"]) if kw.get("cache_salt") is not None else None
    pb = b.CreateByteVector(kw["parent_bytes"]) if kw.get("parent_bytes") is not None else None
    hb = b.CreateByteVector(kw["hash_bytes"]) if kw.get("hash_bytes") is not None else None
    k = b.CreateString(kw["kind"]) if kw.get("kind") is not None else None
    x = b.CreateByteVector(kw["extra_keys"]) if kw.get("extra_keys") is not None else None
    m = b.CreateString(kw["medium"]) if kw.get("medium") is not None else None
    Meta.MetaStart(b)
    if m is not None:
        Meta.MetaAddMedium(b, m)
    if kw.get("lora_id") is not None:
        Meta.MetaAddLoraId(b, kw["lora_id"])
    if kw.get("block_size") is not None:
        Meta.MetaAddBlockSize(b, kw["block_size"])
    if x is not None:
        Meta.MetaAddExtraKeys(b, x)
    if kw.get("group_idx") is not None:
        Meta.MetaAddGroupIdx(b, kw["group_idx"])
    if k is not None:
        Meta.MetaAddKvCacheSpecKind(b, k)
    if kw.get("sliding_window") is not None:
        Meta.MetaAddKvCacheSpecSlidingWindow(b, kw["sliding_window"])
    if hb is not None:
        Meta.MetaAddBlockHashBytes(b, hb)
    if pb is not None:
        Meta.MetaAddParentHashBytes(b, pb)
    if cs is not None:
        Meta.MetaAddCacheSalt(b, cs)
    if ss is not None:
        Meta.MetaAddSessionId(b, ss)
    b.Finish(Meta.MetaEnd(b))
    return bytes(b.Output())


def test_meta_matches_official_builder() -> None:
    rng = random.Random(12)
    for _ in range(2000):
        kw: dict[str, Any] = {}
        if rng.random() < 0.5:
            kw["medium"] = rng.choice(["GPU", "", "CPU", "é" * rng.randint(0, 5)])
        if rng.random() < 0.5:
            kw["lora_id"] = rng.randint(-(2**63), 2**63 - 1)
        if rng.random() < 0.5:
            kw["block_size"] = rng.randint(0, 2**32 - 1)
        if rng.random() < 0.5:
            kw["extra_keys"] = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 13)))
        if rng.random() < 0.5:
            kw["group_idx"] = rng.randint(0, 2**32 - 1)
        if rng.random() < 0.5:
            kw["kind"] = "k" * rng.randint(0, 11)
        if rng.random() < 0.5:
            kw["sliding_window"] = rng.randint(0, 2**32 - 1)
        if rng.random() < 0.5:
            kw["hash_bytes"] = bytes(rng.randint(0, 255) for _ in range(rng.choice([0, 2, 32, 64, 96])))
        if rng.random() < 0.5:
            kw["parent_bytes"] = bytes(rng.randint(0, 255) for _ in range(rng.choice([0, 1, 32])))
        if rng.random() < 0.3:
            kw["cache_salt"] = "s" * rng.randint(0, 9)
        if rng.random() < 0.3:
            kw["session_id"] = "ü" * rng.randint(0, 5)
        assert build_meta(**kw) == official_meta(**kw), kw
