"""A set of ints with O(1) add, discard and uniform choice: what a seeded workload generator picks leaves from."""

from __future__ import annotations

import random


class IndexedSet:
    """A set of ints kept in a list and a position map: add and discard are O(1) (discard swaps the last item into
    the hole), and :meth:`choice` picks uniformly with the caller's seeded ``random.Random``, so a generator's
    choices depend only on its seed and the order of its adds and discards."""

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.pos: dict[int, int] = {}

    def add(self, x: int) -> None:
        if x not in self.pos:
            self.pos[x] = len(self.items)
            self.items.append(x)

    def discard(self, x: int) -> None:
        i = self.pos.pop(x, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i

    def clear(self) -> None:
        self.items.clear()
        self.pos.clear()

    def choice(self, rng: random.Random) -> int:
        """A uniformly chosen member; ``IndexError`` when empty."""
        if not self.items:
            raise IndexError("choice from an empty IndexedSet")
        return self.items[rng.randrange(len(self.items))]

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, x: object) -> bool:
        return x in self.pos
