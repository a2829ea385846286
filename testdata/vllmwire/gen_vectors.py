"""Generate the vllmwire test vectors: KVEventBatch payloads encoded by msgspec, as vLLM 0.33.0 sends them.

The structs are vLLM 0.33.0's shape (vllm_structs.py, next to this script: events are tagged maps). Each vector is
the input (in kvshm's terms, as vllmwire.Event reads it) and the hex of msgspec's encoding; vllmwire's Go test
requires byte identity.

Usage: python gen_vectors.py [OUT]   (default: vectors.json next to this script; `-` for stdout)
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
from vllm_structs import AllBlocksCleared, BlockRemoved, BlockStored, Event, KVEventBatch  # noqa: E402


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
    inp = {"kind": "stored", "block_hashes": hashes, "token_ids": windows, "is_eagle": eagle, "block_size": bs, **f}
    inp["extra_keys_hex"] = None if ek is None else msgspec.msgpack.encode(ek).hex()
    return inp, ev


def removed(rng: random.Random, **kw: Any) -> tuple[dict[str, Any], BlockRemoved]:
    hashes = kw.pop("block_hashes", [rng.getrandbits(64) for _ in range(rng.randint(0, 4))])
    medium = kw.pop("medium", "GPU")
    group = kw.pop("group_idx", None)
    assert not kw, kw
    inp = {"kind": "removed", "block_hashes": hashes, "medium": medium, "group_idx": group}
    return inp, BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group)


def cleared() -> tuple[dict[str, Any], AllBlocksCleared]:
    return {"kind": "cleared"}, AllBlocksCleared()


def vectors() -> list[dict[str, Any]]:
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
    out = []
    for name, ts, dp, evs in cases:
        batch = KVEventBatch(ts=ts, events=[e for _, e in evs], data_parallel_rank=dp)
        payload = msgspec.msgpack.encode(batch)
        back = msgspec.msgpack.decode(payload)  # untyped: Eagle's pairs are not vLLM's list[int]
        assert back[0] == ts and len(back[1]) == len(evs), name
        out.append({"name": name, "ts": ts, "dp_rank": dp, "events": [i for i, _ in evs], "payload_hex": payload.hex()})
    return out


def main() -> None:
    dest = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("vectors.json"))
    text = json.dumps({"msgspec": msgspec.__version__, "vectors": vectors()}, indent=1, ensure_ascii=False) + "\n"
    if dest == "-":
        sys.stdout.write(text)
    else:
        Path(dest).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
