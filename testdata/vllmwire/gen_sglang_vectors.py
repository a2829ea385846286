"""Generate vllmwire's SGLang vectors: KVEventBatch payloads written by SGLang 0.5.23's own structs and msgspec.

Runs in the SGLang engine venv (``make sglangenv``): the events are ``sglang.srt.disaggregation.kv_events``'
``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared`` and ``KVEventBatch``, encoded by a
``msgspec.msgpack.Encoder`` as SGLang's ``ZmqEventPublisher`` encodes a batch (its publish thread's ``self._pack``).
Each vector is the input in kvshm's terms (as vllmwire.Event reads it: ``block_hashes`` and ``parent`` are the index
keys, the hashes' 64-bit patterns, so SGLang's -1 is 2**64-1) and the hex of SGLang's encoding; vllmwire's Go test
and ``make sglang-plugin-test`` require byte identity.

Usage: build/sglangenv/bin/python testdata/vllmwire/gen_sglang_vectors.py [OUT]   (default OUT: vectors_sglang.json
next to this script; ``-`` for stdout)
"""

from __future__ import annotations

import json
import random
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    StorageMedium,
)

MASK = (1 << 64) - 1
# Signed forms msgspec picks by size: negative fixint down to -32, then int8/16/32/64; and their neighbours.
BOUNDARIES = [0, 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63), 2**63 - 1, 127,
              128, 2**32]


def i64(rng: random.Random) -> int:
    """A random signed 64-bit hash, as SGLang's hash_str_to_int64 gives (about half negative)."""
    return rng.getrandbits(64) - (1 << 63)


def stored(rng: random.Random, **kw: Any) -> tuple[dict[str, Any], Any]:
    nb = kw.pop("nblocks", rng.randint(1, 4))
    bs = kw.pop("block_size", rng.choice([1, 4, 16]))
    eagle = kw.pop("eagle", False)
    hashes = kw.pop("block_hashes", [i64(rng) for _ in range(nb)])
    nb = len(hashes)
    ntok = nb * bs + 1 if eagle else nb * bs
    stream = kw.pop("token_ids", [rng.getrandbits(rng.choice([7, 16, 17])) for _ in range(ntok)])
    # SGLang's bigram pages (EAGLE): the pairs (raw[j], raw[j + 1]); kvshm holds the stream.
    wire_tokens: list[Any] = [(stream[i], stream[i + 1]) for i in range(len(stream) - 1)] if eagle else stream
    f: dict[str, Any] = {
        "parent": kw.pop("parent", rng.choice([None, i64(rng)])),
        "lora_id": kw.pop("lora_id", None),
        "medium": kw.pop("medium", StorageMedium.GPU),
        "cache_salt": kw.pop("cache_salt", None),
        "session_id": kw.pop("session_id", None),
        "lora_name": kw.pop("lora_name", None),
    }
    assert not kw, kw
    ev = BlockStored(block_hashes=hashes, parent_block_hash=f["parent"], token_ids=wire_tokens, block_size=bs,
                     lora_id=f["lora_id"], medium=f["medium"], cache_salt=f["cache_salt"],
                     session_id=f["session_id"], lora_name=f["lora_name"])
    parent = f.pop("parent")
    medium = f.pop("medium")
    inp = {"kind": "stored", "block_hashes": [h & MASK for h in hashes], "token_ids": stream, "is_eagle": eagle,
           "block_size": bs, "parent": None if parent is None else parent & MASK,
           "medium": None if medium is None else str(getattr(medium, "value", medium)), **f}
    return inp, ev


def removed(rng: random.Random, **kw: Any) -> tuple[dict[str, Any], Any]:
    hashes = kw.pop("block_hashes", [i64(rng) for _ in range(rng.randint(1, 4))])
    medium = kw.pop("medium", StorageMedium.GPU)
    assert not kw, kw
    inp = {"kind": "removed", "block_hashes": [h & MASK for h in hashes],
           "medium": None if medium is None else str(getattr(medium, "value", medium))}
    return inp, BlockRemoved(block_hashes=hashes, medium=medium)


def cleared() -> tuple[dict[str, Any], Any]:
    return {"kind": "cleared"}, AllBlocksCleared()


def vectors() -> list[dict[str, Any]]:
    rng = random.Random(20261206)
    cases: list[tuple[str, float, int | None, list[tuple[dict[str, Any], Any]]]] = [
        ("empty", 0.0, 0, []),
        ("startup cleared", 1765000000.25, 0, [cleared()]),
        ("one page, root", 1.5, 0, [stored(rng, nblocks=1, block_size=16, parent=None)]),
        ("merged chain, negative parent", 2.0, 0, [stored(rng, nblocks=4, block_size=4, parent=-5)]),
        ("hash boundaries", 3.0, 0,
         [stored(rng, block_hashes=BOUNDARIES, block_size=1, parent=-(2**63)),
          removed(rng, block_hashes=BOUNDARIES)]),
        ("salt, session, lora", 4.0, 1,
         [stored(rng, nblocks=2, block_size=2, lora_id=3, cache_salt="salt-ä", session_id="sess-1",
                 lora_name="adapter")]),
        ("only session", 5.0, 0, [stored(rng, nblocks=1, block_size=2, session_id="s" * 40)]),
        ("medium None", 6.0, 0, [stored(rng, nblocks=1, block_size=2, medium=None), removed(rng, medium=None)]),
        ("host tier", 7.0, 0, [stored(rng, nblocks=2, block_size=2, medium=StorageMedium.CPU),
                               removed(rng, medium=StorageMedium.CPU)]),
        ("negative lora_id", 8.0, 0, [stored(rng, nblocks=1, block_size=1, lora_id=-40)]),
        ("bigram pages", 9.0, 0, [stored(rng, nblocks=3, block_size=4, eagle=True)]),
        ("evict then store", 10.0, 3, [removed(rng), removed(rng), stored(rng), cleared()]),
        ("big arrays", 11.0, 70000,
         [stored(rng, nblocks=20, block_size=1, medium="M" * 300), removed(rng, block_hashes=[i64(rng) for _ in
                                                                                           range(300)])]),
        ("dp_rank None", 12.0, None, [cleared()]),
    ]
    for i in range(12):
        makers = [lambda: stored(rng), lambda: removed(rng), cleared]
        evs = [rng.choice(makers)() for _ in range(rng.randint(1, 6))]
        cases.append((f"random {i}", rng.uniform(0, 2e9), rng.randint(0, 9), evs))
    enc = msgspec.msgpack.Encoder()
    out = []
    for name, ts, dp, evs in cases:
        data = enc.encode(KVEventBatch(ts=ts, events=[e for _, e in evs], attn_dp_rank=dp))
        back = msgspec.msgpack.decode(data)
        assert back[0] == ts and len(back[1]) == len(evs), name
        out.append({"name": name, "ts": ts, "dp_rank": dp, "events": [i for i, _ in evs], "payload_hex": data.hex()})
    return out


def main() -> None:
    dest = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("vectors_sglang.json"))
    doc = {"msgspec": msgspec.__version__, "sglang": version("sglang"), "wire": "sglang", "vectors": vectors()}
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
    else:
        Path(dest).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
