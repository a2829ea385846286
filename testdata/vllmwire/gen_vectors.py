"""Generate the vllmwire test vectors: KVEventBatch payloads encoded by msgspec, as a vLLM release sends them.

The structs are the release's shape (vllm_structs.py, next to this script: events are tagged maps; ``--wire 0.33``,
the default, ``--wire 0.32`` or ``--wire 0.31``). Each vector is the input (in kvshm's terms, as vllmwire.Event
reads it) and the hex of msgspec's encoding; vllmwire's Go test requires byte identity. Every release gets the same
cases.

Bytes block hashes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) go in as ``block_hash_bytes_hex`` (the
event's hashes concatenated, all one length) and ``parent_bytes_hex``; ``block_hashes`` / ``parent`` then hold
the index keys kvshm derives from them (the last 8 bytes, big-endian: vLLM's own int form, and newer Dynamo's).

Usage: python gen_vectors.py [--wire 0.33|0.32|0.31] [OUT]   (default OUT: vectors.json, or vectors_0.32.json, next to
this script; `-` for stdout)
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_structs import WIRES, AllBlocksCleared, BlockRemoved, BlockStored, Event, Structs, payload  # noqa: E402

# The vectors file of each wire, next to this script.
FILES = {"0.33": "vectors.json", "0.32": "vectors_0.32.json", "0.31": "vectors_0.31.json"}
assert set(FILES) == set(WIRES), "a vectors file per release of vllm_structs.WIRES"


def key(h: bytes | int) -> int:
    """kvshm's index key of a block hash: an int as it is, bytes as their last 8 bytes big-endian."""
    return h if isinstance(h, int) else int.from_bytes(h[-8:], "big")


def stored(rng: random.Random, **kw: Any) -> tuple[dict[str, Any], BlockStored]:
    nb = kw.pop("nblocks", rng.randint(0, 4))
    bs = kw.pop("block_size", rng.choice([1, 4, 16, 32]))
    eagle = kw.pop("eagle", False)
    hashes = kw.pop("block_hashes", [rng.getrandbits(rng.choice([6, 8, 16, 32, 64])) for _ in range(nb)])
    nb = len(hashes)
    # kvshm's tokens: nblocks × block_size, or the Eagle stream of nblocks × block_size + 1 (block b's window is
    # stream[b*bs : b*bs+bs+1]), sent as vLLM/Dynamo pairs [s[i], s[i+1]].
    ntok = nb * bs + 1 if eagle else nb * bs
    windows = kw.pop("token_ids", [rng.getrandbits(rng.choice([7, 8, 16, 17])) for _ in range(ntok)])
    wire_tokens: list[Any] = windows
    if eagle:
        wire_tokens = [(windows[i], windows[i + 1]) for i in range(len(windows) - 1)]
    f: dict[str, Any] = {
        "parent": kw.pop("parent", rng.choice([None, rng.getrandbits(64), 0])),
        "lora_id": kw.pop("lora_id", None),
        "medium": kw.pop("medium", "GPU"),
        "lora_name": kw.pop("lora_name", None),
        "extra_keys": kw.pop("extra_keys", None),
        "group_idx": kw.pop("group_idx", None),
        "kv_cache_spec_kind": kw.pop("kv_cache_spec_kind", None),
        "kv_cache_spec_sliding_window": kw.pop("kv_cache_spec_sliding_window", None),
    }
    assert not kw, kw
    ev = BlockStored(
        block_hashes=hashes,
        parent_block_hash=f["parent"],
        token_ids=wire_tokens,
        block_size=bs,
        lora_id=f["lora_id"],
        medium=f["medium"],
        lora_name=f["lora_name"],
        extra_keys=f["extra_keys"],
        group_idx=f["group_idx"],
        kv_cache_spec_kind=f["kv_cache_spec_kind"],
        kv_cache_spec_sliding_window=f["kv_cache_spec_sliding_window"],
    )
    ek = f.pop("extra_keys")
    parent = f.pop("parent")
    inp = {"kind": "stored", "block_hashes": [key(h) for h in hashes], "token_ids": windows, "is_eagle": eagle,
           "block_size": bs, "parent": None if parent is None else key(parent), **f}
    inp["extra_keys_hex"] = None if ek is None else msgspec.msgpack.encode(ek).hex()
    bytes_fields(inp, hashes, parent)
    return inp, ev


def bytes_fields(inp: dict[str, Any], hashes: list[Any], parent: Any = None) -> None:
    """The bytes-hash inputs, only when the event has them (the int vectors keep their shape)."""
    if any(isinstance(h, bytes) for h in hashes):
        inp["block_hash_bytes_hex"] = b"".join(hashes).hex()
    if isinstance(parent, bytes):
        inp["parent_bytes_hex"] = parent.hex()


def removed(rng: random.Random, **kw: Any) -> tuple[dict[str, Any], BlockRemoved]:
    hashes = kw.pop("block_hashes", [rng.getrandbits(64) for _ in range(rng.randint(0, 4))])
    medium = kw.pop("medium", "GPU")
    group = kw.pop("group_idx", None)
    assert not kw, kw
    inp = {"kind": "removed", "block_hashes": [key(h) for h in hashes], "medium": medium, "group_idx": group}
    bytes_fields(inp, hashes)
    return inp, BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group)


def cleared() -> tuple[dict[str, Any], AllBlocksCleared]:
    return {"kind": "cleared"}, AllBlocksCleared()


def vectors(wire: str, structs: Structs | None = None) -> list[dict[str, Any]]:
    """The vectors of a release, its payloads encoded from vllm_structs.py's classes, or from ``structs`` (the
    installed vLLM's own: pybind/vllm_test compares those with the committed file)."""
    rng = random.Random(20261201)
    cases: list[tuple[str, float, int | None, list[tuple[dict[str, Any], Event]]]] = [
        ("empty", 0.0, 0, []),
        ("one stored, the old API's one-event batch", 1764567890.123456, 0,
         [stored(rng, nblocks=2, block_size=4, parent=None, medium="GPU")]),
        ("stored with parent 0 and lora", 1.5, 3,
         [stored(rng, nblocks=1, block_size=2, parent=0, lora_id=7, lora_name="adapter-ä")]),
        ("medium None", 2.0, 0, [stored(rng, nblocks=1, block_size=2, medium=None)]),
        ("CPU medium, group and spec", 3.25, 1,
         [stored(rng, nblocks=2, block_size=16, medium="CPU", group_idx=1, kv_cache_spec_kind="sliding_window",
                 kv_cache_spec_sliding_window=4096)]),
        ("extra keys", 4.0, 0,
         [stored(rng, nblocks=2, block_size=2, extra_keys=[("lora-x", ("mm-abc", 3), "salt"), None])]),
        ("negative lora_id", 5.0, 0, [stored(rng, nblocks=1, block_size=1, lora_id=-40)]),
        ("hash boundaries", 6.0, 0,
         [stored(rng, block_hashes=[0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1],
                 block_size=1, token_ids=[0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 5, 6, 7])]),
        ("eagle", 7.0, 0, [stored(rng, nblocks=3, block_size=4, eagle=True)]),
        ("removed", 8.0, 2, [removed(rng), removed(rng, medium=None), removed(rng, group_idx=0)]),
        ("cleared", 9.0, 0, [cleared()]),
        ("long strings and big arrays", 10.0, 70000,
         [stored(rng, nblocks=20, block_size=1, lora_name="n" * 40, medium="M" * 300),
          removed(rng, block_hashes=[rng.getrandbits(64) for _ in range(300)])]),
        ("dp_rank None", 11.0, None, [cleared()]),
    ]
    for i in range(12):
        makers: list[Callable[[], tuple[dict[str, Any], Event]]] = [
            lambda: stored(rng), lambda: removed(rng), cleared]
        evs = [rng.choice(makers)() for _ in range(rng.randint(1, 6))]
        cases.append((f"random {i}", rng.uniform(0, 2e9), rng.randint(0, 9), evs))
    # Bytes block hashes: sha256-sized (vLLM's default hash), shorter than 8 bytes (zero-extended keys), a parent.
    sha = [bytes(rng.getrandbits(8) for _ in range(32)) for _ in range(3)]
    cases += [
        ("bytes hashes", 12.0, 0,
         [stored(rng, block_hashes=sha[1:], parent=sha[0], block_size=2),
          removed(rng, block_hashes=sha[1:2]), stored(rng, block_hashes=[sha[0]], parent=None, block_size=2)]),
        ("bytes hashes short and long", 13.0, 1,
         [removed(rng, block_hashes=[b"\x01\x02", b"\xff\xfe"]), removed(rng, block_hashes=[bytes(300)]),
          removed(rng, block_hashes=[b"", b""]),
          stored(rng, block_hashes=[b"\x00" * 8 + b"\x80" * 8], parent=b"\x07", block_size=1)]),
    ]
    out = []
    for name, ts, dp, evs in cases:
        data = payload(ts, [e for _, e in evs], dp, wire, structs)
        back = msgspec.msgpack.decode(data)  # untyped: Eagle's pairs are not vLLM's list[int]
        assert back[0] == ts and len(back[1]) == len(evs), name
        out.append({"name": name, "ts": ts, "dp_rank": dp, "events": [i for i, _ in evs], "payload_hex": data.hex()})
    return out


def main() -> None:
    args = sys.argv[1:]
    wire = "0.33"
    if args[:1] == ["--wire"]:
        wire, args = args[1], args[2:]
    if wire not in FILES:
        sys.exit(f"gen_vectors.py: unknown wire {wire!r}: one of {sorted(FILES)}")
    dest = args[0] if args else str(Path(__file__).with_name(FILES[wire]))
    doc = {"msgspec": msgspec.__version__, "wire": wire, "vectors": vectors(wire)}
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
    else:
        Path(dest).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
