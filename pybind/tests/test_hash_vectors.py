"""The shared token-hash vectors (testdata/hash/vectors.json, checked against the Go index by
index/hash_test.go): each vector's tokens, published through LocalIndexer as a root store, come back in the
TreeDump JSON with exactly the vector's tokens_hash values."""

from __future__ import annotations

import json
from typing import Any

from conftest import IndexerFactory
from helpers import TESTDATA, query, variant

VECTORS: list[dict[str, Any]] = json.loads((TESTDATA / "hash" / "vectors.json").read_text())["vectors"]


def publishable(v: dict[str, Any]) -> bool:
    """A Stored event carries exactly block_size tokens per block (Eagle: one lookahead token more)."""
    n = len(v["tokens_hashes"])
    return n > 0 and len(v["tokens"]) == n * v["block_size"] + (1 if v["is_eagle"] else 0)


def test_vectors_file_covers_the_cases() -> None:
    assert len(VECTORS) >= 10
    assert any(v["is_eagle"] and len(v["tokens_hashes"]) >= 2 and publishable(v) for v in VECTORS)
    assert any(v["lora_name"] and publishable(v) for v in VECTORS)


def test_tree_dump_tokens_hashes_equal_the_vectors(make_indexer: IndexerFactory) -> None:
    # One indexer per group: same block size, and no tokens_hash shared between the group's vectors (the radix
    # tree keys children by tokens_hash, so two root stores with equal first windows would share a node).
    groups: list[tuple[int, set[int], list[tuple[int, dict[str, Any]]]]] = []
    for i, v in enumerate(VECTORS):
        if not publishable(v):
            continue
        ths = set(v["tokens_hashes"])
        for bs_, seen, members in groups:
            if bs_ == v["block_size"] and not seen & ths:
                seen |= ths
                members.append((i, v))
                break
        else:
            groups.append((v["block_size"], ths, [(i, v)]))
    checked = 0
    for bs, _, vecs in groups:
        ix = make_indexer(worker_id=3, kv_block_size=bs)
        want: dict[int, tuple[str, int]] = {}
        for seq, (i, v) in enumerate(vecs):
            hashes = [((i + 1) << 20) + k for k in range(len(v["tokens_hashes"]))]
            ix.apply_stored(
                seq, v["tokens"], hashes, parent_hash=None, lora_name=v["lora_name"], is_eagle=v["is_eagle"] or None
            )
            want.update({h: (v["name"], th) for h, th in zip(hashes, v["tokens_hashes"], strict=True)})
        dump = query(ix)
        assert variant(dump) == "TreeDump", dump
        got = {}
        for e in dump["TreeDump"]["events"]:
            for b in e["event"]["data"]["stored"]["blocks"]:
                got[b["block_hash"]] = b["tokens_hash"]
        assert set(got) == set(want)
        for h, (name, th) in want.items():
            assert got[h] == th, f"{name}: block {h} tokens_hash {got[h]}, want {th}"
            checked += 1
    assert checked >= 20
