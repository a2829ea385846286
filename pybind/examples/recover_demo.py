"""kvshm end to end: an engine-like publisher drives kvshm, then a global indexer recovers from the worker.

Run with `make demo` (builds the wheel with its static kvshmd, installs it into build/demoenv and runs this file).
The publisher behaves like TensorRT-LLM's KV-event publisher: one event per seq, prompts that share system-prompt
prefixes, stores chained by parent hash, evictions, signed 64-bit engine hashes, and a cache reset.
"""

from __future__ import annotations

import hashlib
import json
import random
import time

from kvshm import LocalIndexer

BLOCK = 32  # TensorRT-LLM's default tokens_per_block


def engine_hash(parent: int | None, tokens: list[int]) -> int:
    """A rolling block hash as engines send it: signed 64-bit (negative half the time)."""
    h = hashlib.blake2b(digest_size=8)
    h.update((parent or 0).to_bytes(8, "little", signed=True))
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return int.from_bytes(h.digest(), "little", signed=True)


def summarize(label: str, body: str) -> None:
    reply = json.loads(body)
    (variant, payload), = reply.items()
    if variant in ("Events", "TreeDump"):
        kinds: dict[str, int] = {}
        for ev in payload["events"]:
            data = ev["event"]["data"]
            kind = data if isinstance(data, str) else next(iter(data))
            kinds[kind] = kinds.get(kind, 0) + 1
        detail = f"{len(payload['events'])} events {kinds}, last_event_id={payload['last_event_id']}"
    else:
        detail = json.dumps(payload)
    print(f"  {label:<34} -> {variant}: {detail} ({len(body)} bytes)")


def main() -> None:
    rng = random.Random(2026)
    system_prompts = [[rng.randrange(32_000) for _ in range(BLOCK * 4)] for _ in range(4)]
    resident: list[int] = []  # suffix block hashes in store order, oldest first (an LRU stand-in)
    cached_prompts: set[int] = set()  # system prompts whose 4 prefix blocks the cache holds
    seq = 0
    publish_seconds = 0.0
    calls = 0

    with LocalIndexer(worker_id=7, kv_block_size=BLOCK, max_buffer_size=2000) as ix:
        for request in range(600):
            prompt = rng.randrange(len(system_prompts))
            tokens = system_prompts[prompt] + [rng.randrange(32_000) for _ in range(BLOCK * rng.randrange(1, 12))]
            parent: int | None = None
            hashes = []
            for b in range(len(tokens) // BLOCK):
                parent = engine_hash(parent, tokens[b * BLOCK:(b + 1) * BLOCK])
                hashes.append(parent)
            # Only the request's new blocks are stored; a cached system prompt is reused as the parent.
            new_from = 4 if prompt in cached_prompts else 0
            cached_prompts.add(prompt)
            t0 = time.perf_counter()
            ix.apply_stored(
                seq,
                tokens[new_from * BLOCK:],
                hashes[new_from:],
                parent_hash=hashes[new_from - 1] if new_from else None,
                dp_rank=request % 2,
            )
            publish_seconds += time.perf_counter() - t0
            calls += 1
            seq += 1
            resident.extend(hashes[4:])
            if len(resident) > 3000:  # evict the oldest unshared blocks, as the engine's allocator would
                evicted, resident = resident[:64], resident[64:]
                t0 = time.perf_counter()
                ix.apply_removed(seq, evicted, dp_rank=request % 2)
                publish_seconds += time.perf_counter() - t0
                calls += 1
                seq += 1
            if request == 450:  # the engine reset its prefix cache
                ix.apply_cleared(seq)
                seq += 1
                calls += 1
                resident.clear()
                cached_prompts.clear()
        last = seq - 1
        print(f"published {calls} events (ids 0..{last}), {publish_seconds / calls * 1e6:.1f} µs per publish call")

        print("recovery queries, as a global indexer sends them (GET /kv_recover?start=&end=):")
        summarize(f"get_events_json({last - 4}, {last})", ix.get_events_json(last - 4, last))
        summarize("get_events_json() (full snapshot)", ix.get_events_json())
        summarize("get_events_json(3) (older than log)", ix.get_events_json(3))
        summarize(f"get_events_json({last + 10})", ix.get_events_json(last + 10))
        summarize("get_events_json(20, 10)", ix.get_events_json(20, 10))
        stats = ix.stats()
        print("stats:", json.dumps(stats, sort_keys=True, default=str)[:600])


if __name__ == "__main__":
    main()
