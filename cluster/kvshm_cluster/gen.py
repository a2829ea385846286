"""A producer's seeded cache: the events an engine-like producer publishes and the truth they leave.

One :class:`Cache` per producer life of one ``(worker, dp_rank)``. Its events keep to what an engine does and what
every router applies the same way, so the truth is simply the set of held hashes: block hashes are fresh random
u63s (never reused), a Stored chain hangs at the root or under a leaf chain, a Removed names a leaf chain whole,
a Cleared (on command) empties the cache. The cache stays near ``capacity`` blocks: past it, the
producer evicts leaves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from kvshm_testkit.indexedset import IndexedSet

BLOCK_SIZE: Final = 4
CHAIN_MAX: Final = 4  # blocks per Stored event in steady load
# No steady batch is an AllBlocksCleared (an engine clears on reset_prefix_cache, rarely): one inside a lost window
# would repair a router by luck (seen: vLLM's router exact after a partition, a Cleared in the replayed tail). The
# harness publishes one explicitly before each fault (``Cache.clear``, the ``clear`` command).


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[int, ...]
    parent: int | None
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


def _tokens(h: int) -> tuple[int, ...]:
    """A block's token ids, a function of its (unique) hash: no two blocks anywhere in the cluster share content.
    Dynamo's tree shares nodes by content across workers and expects the same content to carry the same hash."""
    m = (1 << 31) - 1
    return (h & m, (h >> 31) & m, 1, 2)[:BLOCK_SIZE]


class Cache:
    """The cache of one producer life: ``blocks`` (hash -> parent) is the truth after every event it made.

    The unit of storing and removing is a *segment*: the blocks of one Stored event. A segment hangs at the root
    or under the last block of a leaf segment; a Removed names a whole leaf segment, so the truth never depends on
    how a router treats a chain cut part-way (the cluster judges delivery, not tree rules).
    """

    def __init__(self, seed: int, worker: int, rank: int, life: int, capacity: int) -> None:
        self.rng = random.Random(f"kvshm-cluster:{seed}:{worker}:{rank}:{life}")
        self.capacity = capacity
        self.blocks: dict[int, int | None] = {}
        self.segments: dict[int, tuple[int, ...]] = {}  # a segment's last hash -> its hashes
        self.children: dict[int, int] = {}  # a segment's last hash -> child segments
        self.leaves = IndexedSet()  # last hashes of segments without children

    def hashes(self) -> frozenset[int]:
        return frozenset(self.blocks)

    def _fresh(self) -> int:
        while True:
            h = self.rng.getrandbits(63) | 1
            if h not in self.blocks:
                return h

    def store(self, n: int, parent: int | None) -> Stored:
        """A segment of ``n`` new blocks under ``parent`` (a leaf segment's last hash, or None), applied."""
        hashes = tuple(self._fresh() for _ in range(n))
        tokens = tuple(t for h in hashes for t in _tokens(h))
        if parent is not None:
            self.children[parent] = self.children.get(parent, 0) + 1
            self.leaves.discard(parent)
        prev = parent
        for h in hashes:
            self.blocks[h] = prev
            prev = h
        self.segments[hashes[-1]] = hashes
        self.leaves.add(hashes[-1])
        return Stored(hashes, parent, tokens)

    def remove_leaf(self) -> Removed | None:
        if not self.leaves:
            return None
        tail = self.leaves.choice(self.rng)
        self.leaves.discard(tail)
        hashes = self.segments.pop(tail)
        parent = self.blocks[hashes[0]]
        for h in hashes:
            del self.blocks[h]
        if parent is not None:
            left = self.children[parent] - 1
            if left:
                self.children[parent] = left
            else:
                del self.children[parent]
                self.leaves.add(parent)
        return Removed(hashes)

    def clear(self) -> Cleared:
        self.blocks.clear()
        self.segments.clear()
        self.children.clear()
        self.leaves.clear()
        return Cleared()

    def step(self) -> list[Event]:
        """One engine step's batch: a few stores and removes."""
        out: list[Event] = []
        for _ in range(self.rng.randint(1, 4)):
            if len(self.blocks) >= self.capacity or (self.blocks and self.rng.random() < 0.35):
                ev = self.remove_leaf()
                if ev is not None:
                    out.append(ev)
                    continue
            parent = self.leaves.choice(self.rng) if self.leaves and self.rng.random() < 0.5 else None
            out.append(self.store(self.rng.randint(1, CHAIN_MAX), parent))
        return out

    def probe(self) -> list[Event]:
        """A batch that leaves the cache as it was (one root block stored and removed): traffic for a router to
        see its gap by, as a serving engine's next step would give it, without moving the truth."""
        s = self.store(1, None)
        r = self.remove_segment(s.hashes[-1])
        return [s, r]

    def remove_segment(self, tail: int) -> Removed:
        self.leaves.discard(tail)
        hashes = self.segments.pop(tail)
        for h in hashes:
            del self.blocks[h]
        return Removed(hashes)

    def prefill(self, blocks: int, per_event: int = 16, per_batch: int = 64) -> list[list[Event]]:
        """``blocks`` new blocks as large batches (``per_batch`` root segments of ``per_event`` blocks)."""
        out: list[list[Event]] = []
        batch: list[Event] = []
        left = blocks
        while left > 0:
            n = min(per_event, left)
            left -= n
            batch.append(self.store(n, None))
            if len(batch) == per_batch:
                out.append(batch)
                batch = []
        if batch:
            out.append(batch)
        return out
