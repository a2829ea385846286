"""kvshm end to end, the way an engine worker uses it: start, publish a synthetic KV-event stream, answer recovery
queries, print the answers.

    python pybind/examples/publisher_demo.py          # with kvshm installed (e.g. build/testenv/bin/python)

The stream imitates a prefix cache with kv_block_size 16 on two attention-DP ranks: requests share system-prompt
prefixes (their own blocks are stored chained under the prompt's last block), one prompt runs with a LoRA adapter,
the cache evicts (removes) and is reset once (cleared). Then the global indexer's recovery calls are answered with ``get_events_json`` exactly as the old
``kv_local_indexer`` extension did.
"""

from __future__ import annotations

import json
import random
import time

from kvshm import LocalIndexer

BS = 16


def synthetic_stream(ix: LocalIndexer, n_requests: int, rng: random.Random) -> int:
    """Publishes about 1.2 events per request; returns the next seq."""
    prompts = [[rng.randrange(150000) for _ in range(BS * 4)] for _ in range(3)]  # 3 system prompts, 4 blocks
    next_hash = -(1 << 62)  # engines send signed 64-bit hashes; kvshm stores their u64 form

    def new_hashes(n: int) -> list[int]:
        nonlocal next_hash
        next_hash += n
        return list(range(next_hash - n, next_hash))

    prefix: dict[tuple[int, int], list[int]] = {}  # (dp_rank, prompt) -> cached prompt block hashes
    owned: dict[int, list[list[int]]] = {0: [], 1: []}  # dp_rank -> suffix chains, oldest first
    seq = 0
    for r in range(n_requests):
        dp, p = r % 2, r % 3
        lora = "sql-adapter" if p == 2 else None
        if (dp, p) not in prefix:  # first use of this prompt on this rank: store it from the root
            prefix[(dp, p)] = new_hashes(4)
            ix.apply_stored(seq, prompts[p], prefix[(dp, p)], parent_hash=None, dp_rank=dp, lora_name=lora)
            seq += 1
        n = rng.randint(1, 6)  # the request's own blocks, chained under the prompt's last block
        chain = new_hashes(n)
        tokens = [rng.randrange(150000) for _ in range(BS * n)]
        ix.apply_stored(seq, tokens, chain, parent_hash=prefix[(dp, p)][-1], dp_rank=dp, lora_name=lora)
        seq += 1
        owned[dp].append(chain)
        if len(owned[dp]) > 50:  # evict the oldest request's blocks
            ix.apply_removed(seq, owned[dp].pop(0), dp_rank=dp)
            seq += 1
        if r == n_requests // 2:  # a cache reset (worker-wide)
            ix.apply_cleared(seq)
            seq += 1
            prefix.clear()
            owned = {0: [], 1: []}
    return seq


def summary(answer: str) -> str:
    value = json.loads(answer)
    (variant, body), = value.items()
    if variant in ("Events", "TreeDump"):
        ids = [e["event"]["event_id"] for e in body["events"]]
        span = f"ids {ids[0]}..{ids[-1]}" if ids else "no events"
        return f"{variant}: {len(ids)} events ({span}), last_event_id {body['last_event_id']}"
    return f"{variant}: {json.dumps(body)}"


def main() -> None:
    rng = random.Random(7)
    t0 = time.perf_counter()
    with LocalIndexer(worker_id=0, kv_block_size=BS, max_buffer_size=1000) as ix:
        print(f"started: {ix!r} in {(time.perf_counter() - t0) * 1000:.1f} ms")
        last = synthetic_stream(ix, 2000, rng) - 1
        print(f"published {last + 1} events (stores with parents, 2 dp_ranks, LoRA, removes, one clear)")
        for start, end in ((last - 3, last), (last - 3, None), (None, None), (0, 10), (last + 5, None), (9, 3)):
            t2 = time.perf_counter()
            answer = ix.get_events_json(start, end)
            ms = (time.perf_counter() - t2) * 1000
            print(f"get_events_json({start}, {end}) -> {summary(answer)}  [{len(answer)} bytes, {ms:.1f} ms]")
        print("newest event as the global indexer receives it:")
        print(json.dumps(json.loads(ix.get_events_json(last))["Events"]["events"][-1]))
        st = ix.stats()
        print(f"stats: published {st['published_events']}, dropped {st['dropped_events']}, "
              f"ring {st['ring']['capacity'] >> 20} MiB at {st['ring_path']}, daemon pid {st['daemon_pid']}")
    print("shut down: daemon stopped, socket and ring removed")


if __name__ == "__main__":
    main()
