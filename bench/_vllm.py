"""vLLM-shaped KV events for the publisher benchmark (zmq_bench.py), and seeded engine-like batches of them.

The Structs are vLLM 0.33.0's wire shape (testdata/vllmwire/vllm_structs.py, their one home), so the benchmark
needs msgspec only, not vLLM: an event batch is an array-like ``[ts, [events...], data_parallel_rank]``, its events
tagged maps ``{"type": "BlockStored", "block_hashes": ..., ...}``; this is what an engine pays to encode today.
kvshm's ``LocalIndexer.apply_batch`` recognizes the events by class name and vLLM's attribute names, so these objects
pass as vLLM's own would.

Two workloads, both seeded and deterministic (every side of the benchmark sees the same batches, in order):

* ``headline``: one BlockStored of 32 blocks x 32 tokens per batch, chains of 8 batches (each event's parent the
  previous event's last block), tokens random per event so no two chains share a root window;
* ``mix``: 1-4 events per batch: BlockStored of 1-32 blocks (70% continuing the newest chain while its tail is
  resident), BlockRemoved of the 1-32 oldest resident blocks (40% of events once blocks are resident, always
  above 50,000 resident), AllBlocksCleared with probability 1/1000 per event.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from pathlib import Path

BLOCK_SIZE = 32  # tokens per block, the stream's kv_block_size
MEDIUM_GPU = "GPU"

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testdata" / "vllmwire"))
from vllm_structs import (  # noqa: E402  (vLLM 0.33.0's structs: their one home)
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "Event", "EventBatch", "KVCacheEvent", "KVEventBatch"]


def _hash(rng: random.Random) -> int:
    return rng.getrandbits(64) | 1  # a u64, never 0


def _stored(rng: random.Random, blocks: int, parent: int | None) -> BlockStored:
    tokens = [rng.randrange(150_000) for _ in range(blocks * BLOCK_SIZE)]
    return BlockStored(block_hashes=[_hash(rng) for _ in range(blocks)], parent_block_hash=parent,
                       token_ids=tokens, block_size=BLOCK_SIZE, lora_id=None, medium=MEDIUM_GPU, lora_name=None)


class Workload:
    """A deterministic stream of batches (each a list of events); ``take(n)`` continues where the last call ended,
    so two instances with the same name and seed give the same batches whatever the chunking."""

    def __init__(self, name: str, seed: int = 12) -> None:
        if name not in ("headline", "mix"):
            raise ValueError(f"unknown workload {name!r}")
        self.name = name
        self.rng = random.Random(f"{name}/{seed}")
        self.j = 0  # headline: position in the chain of 8
        self.tail: int | None = None  # the newest chain's last block, when resident
        self.resident: deque[int] = deque()  # mix: resident blocks, oldest first

    def take(self, n: int) -> list[list[Event]]:
        return [self._next() for _ in range(n)]

    def _next(self) -> list[Event]:
        rng = self.rng
        if self.name == "headline":
            ev = _stored(rng, 32, self.tail if self.j else None)
            self.j = (self.j + 1) % 8
            self.tail = ev.block_hashes[-1]
            return [ev]
        out: list[Event] = []
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.001:
                out.append(AllBlocksCleared())
                self.resident.clear()
                self.tail = None
            elif self.resident and (r < 0.4 or len(self.resident) > 50_000):
                k = min(len(self.resident), rng.randint(1, 32))
                gone = [self.resident.popleft() for _ in range(k)]
                if self.tail in gone:
                    self.tail = None
                out.append(BlockRemoved(block_hashes=gone, medium=MEDIUM_GPU))
            else:
                parent = self.tail if self.tail is not None and rng.random() < 0.7 else None
                ev = _stored(rng, rng.randint(1, 32), parent)
                self.resident.extend(ev.block_hashes)
                self.tail = ev.block_hashes[-1]
                out.append(ev)
        return out
