"""The soak's truth: seeded engine event streams and a model of Dynamo's tree rules.

A producer (``producer.py``) and the judge (``soak.py``) build the same :class:`StreamGen` from the same
``(seed, worker_id, life)`` and so see the same events: the producer publishes them through a real
``kvshm.LocalIndexer``, the judge replays them into a :class:`Tree` to know the engine's true cache after any
event id, and rebuilds a consumer's state from kvshm's ``/kv_recover`` answers with the same :class:`Tree`.

The streams keep to what an engine does, so that the model stays trivially right: block hashes are fresh random
u64s (never reused), Removed names leaves (blocks without stored children) plus now and then a hash the worker
does not hold, a Stored event names a present parent or none (and now and then a missing parent: Dynamo skips the
whole store), a Cleared empties the worker, and some ids are skipped (a gap that is not a loss).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# The soak's scripts run from soak/ without an install; the test kit sits beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testkit"))
from kvshm_testkit.indexedset import IndexedSet  # noqa: E402

U64: Final = 1 << 64


@dataclass(frozen=True, slots=True)
class Event:
    """One engine event. ``kind`` is ``stored``, ``removed`` or ``cleared``; ``tokens`` is empty in the judge's copy."""

    kind: str
    seq: int
    hashes: tuple[int, ...] = ()
    parent: int | None = None
    tokens: tuple[int, ...] = ()


class Tree:
    """One worker's blocks as Dynamo's consumer holds them: block hash -> parent hash (None for a root block).

    Stored: skipped whole when its parent is named and absent (Dynamo's parent_not_found); Removed: best effort;
    Cleared: everything. ``last`` is the id of the newest event applied (None before any).
    """

    __slots__ = ("blocks", "last")

    def __init__(self) -> None:
        self.blocks: dict[int, int | None] = {}
        self.last: int | None = None

    def copy(self) -> Tree:
        t = Tree()
        t.blocks = dict(self.blocks)
        t.last = self.last
        return t

    def apply(self, ev: Event) -> None:
        if ev.kind == "stored":
            if ev.parent is None or ev.parent in self.blocks:
                prev = ev.parent
                for h in ev.hashes:
                    self.blocks[h] = prev
                    prev = h
        elif ev.kind == "removed":
            for h in ev.hashes:
                self.blocks.pop(h, None)
        else:
            self.blocks.clear()
        self.last = ev.seq

    def diff(self, other: Tree) -> str:
        """A one-line description of how ``other`` differs from this tree (empty when equal)."""
        if self.blocks == other.blocks:
            return ""
        missing = [h for h in self.blocks if h not in other.blocks]
        extra = [h for h in other.blocks if h not in self.blocks]
        wrong_parent = [h for h in self.blocks if h in other.blocks and other.blocks[h] != self.blocks[h]]
        return (
            f"want {len(self.blocks)} blocks, got {len(other.blocks)}: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(extra)} extra (e.g. {extra[:3]}), {len(wrong_parent)} with another parent"
        )


class StreamGen:
    """The seeded event stream of one producer life of one worker (ids from ``first_seq``)."""

    def __init__(self, seed: int, worker_id: int, life: int, block_size: int, *, max_blocks: int = 1500) -> None:
        self.rng = random.Random(f"kvshm-soak:{seed}:{worker_id}:{life}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.seq = self.rng.randrange(0, 1000)  # an engine's ids need not start at 0
        self.present = IndexedSet()
        self.leaves = IndexedSet()
        self.children: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}

    def _new_hash(self) -> int:
        while True:
            h = self.rng.randrange(1, U64)
            if h not in self.parent:
                return h

    def next(self, *, kind: str | None = None, with_tokens: bool = True) -> Event:
        """The next event (``kind`` forces one, e.g. a Cleared that re-bases a stream after a fault)."""
        rng = self.rng
        self.seq += 2 if rng.random() < 0.02 else 1  # now and then an id the engine skipped (a gap, not a loss)
        seq = self.seq
        if kind is None:
            r = rng.random()
            if r < 0.005:
                kind = "cleared"
            elif not self.present or (r < 0.6 and len(self.present) < self.max_blocks):
                kind = "stored"
            else:
                kind = "removed"
        if kind == "cleared":
            self.present.clear()
            self.leaves.clear()
            self.children.clear()
            self.parent.clear()
            return Event("cleared", seq)
        if kind == "removed":
            k = min(len(self.leaves), rng.randint(1, 4))
            gone: list[int] = []
            for _ in range(k):
                h = self.leaves.choice(rng)
                self._remove_leaf(h)
                gone.append(h)
            if rng.random() < 0.05:
                gone.append(self._new_hash())  # not held: Dynamo ignores it
            return Event("removed", seq, tuple(gone))
        n = rng.randint(1, 8)
        r = rng.random()
        parent: int | None
        if not self.present or r < 0.25:
            parent = None
        elif r < 0.27:
            parent = self._new_hash()  # a parent the worker does not hold: the whole store is skipped
            hashes = tuple(self._new_hash() for _ in range(n))
            toks = tuple(rng.randrange(0, 1 << 17) for _ in range(n * self.block_size)) if with_tokens else ()
            for h in hashes:
                self.parent[h] = -1  # burnt: never reused
            return Event("stored", seq, hashes, parent, toks)
        else:
            parent = self.present.choice(rng)
        hashes = tuple(self._new_hash() for _ in range(n))
        toks = tuple(rng.randrange(0, 1 << 17) for _ in range(n * self.block_size)) if with_tokens else ()
        prev = parent
        for h in hashes:
            self.parent[h] = prev
            self.present.add(h)
            if prev is not None:
                self.children[prev] = self.children.get(prev, 0) + 1
                self.leaves.discard(prev)
            self.leaves.add(h)
            prev = h
        return Event("stored", seq, hashes, parent, toks)

    def _remove_leaf(self, h: int) -> None:
        self.present.discard(h)
        self.leaves.discard(h)
        p = self.parent.get(h)
        if p is not None and p in self.present:
            c = self.children[p] - 1
            self.children[p] = c
            if c == 0:
                self.leaves.add(p)


@dataclass(slots=True)
class Truth:
    """The judge's copy of a stream: every event generated so far (without tokens) and the true tree at any id."""

    gen: StreamGen
    events: list[Event] = field(default_factory=list)
    _cursor: Tree = field(default_factory=Tree)
    _at: int = 0  # events applied to _cursor

    def advance(self, n: int, *, kind: str | None = None) -> None:
        """Generate ``n`` more events exactly as the producer did."""
        for _ in range(n):
            ev = self.gen.next(kind=kind, with_tokens=True)
            self.events.append(Event(ev.kind, ev.seq, ev.hashes, ev.parent))

    def advance_to(self, seq: int) -> None:
        """Generate events until one with id >= seq exists (a producer killed mid-batch published some)."""
        while not self.events or self.events[-1].seq < seq:
            self.advance(1)

    @property
    def last_seq(self) -> int | None:
        return self.events[-1].seq if self.events else None

    def at(self, seq: int | None) -> Tree:
        """The engine's true tree after every event with id <= seq."""
        if seq is None:
            return Tree()
        self.advance_to(seq)
        if self._cursor.last is not None and self._cursor.last > seq:
            self._cursor, self._at = Tree(), 0
        while self._at < len(self.events) and self.events[self._at].seq <= seq:
            self._cursor.apply(self.events[self._at])
            self._at += 1
        return self._cursor

    def seq_exists(self, seq: int) -> bool:
        self.advance_to(seq)
        lo, hi = 0, len(self.events)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.events[mid].seq < seq:
                lo = mid + 1
            else:
                hi = mid
        return lo < len(self.events) and self.events[lo].seq == seq


class AnswerError(Exception):
    """A /kv_recover body that is not a well-formed WorkerKvQueryResponse."""


def parse_router_event(re: Any) -> Event:
    """A RouterEvent JSON object as the consumer applies it (kvshm's dp_rank and worker_id are checked elsewhere)."""
    try:
        ev = re["event"]
        seq = int(ev["event_id"])
        data = ev["data"]
        if data == "cleared":
            return Event("cleared", seq)
        if "stored" in data:
            st = data["stored"]
            hashes = tuple(int(b["block_hash"]) for b in st["blocks"])
            p = st["parent_hash"]
            return Event("stored", seq, hashes, None if p is None else int(p))
        if "removed" in data:
            return Event("removed", seq, tuple(int(h) for h in data["removed"]["block_hashes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise AnswerError(f"malformed RouterEvent {json.dumps(re)[:200]}: {e!r}") from e
    raise AnswerError(f"unknown RouterEvent data {json.dumps(re)[:200]}")


def consume(state: Tree, body: bytes | str, worker_id: int) -> tuple[str, Tree]:
    """Apply one answer as deepinfra's consumer does: Events onto ``state``, TreeDump onto an empty tree, and
    TooNew / InvalidRange / Error change nothing. Returns the variant and the consumer's new state."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise AnswerError(f"answer is not JSON: {body[:200]!r}") from e
    if not isinstance(doc, dict) or len(doc) != 1:
        raise AnswerError(f"answer is not one variant: {str(body)[:200]}")
    (variant, val), = doc.items()
    if variant in ("Events", "TreeDump"):
        out = Tree() if variant == "TreeDump" else state.copy()
        for re in val["events"]:
            if re.get("worker_id") != worker_id:
                raise AnswerError(f"event of worker {re.get('worker_id')} in worker {worker_id}'s answer")
            out.apply(parse_router_event(re))
        last = val.get("last_event_id")
        out.last = None if last is None else int(last)
        return variant, out
    if variant in ("TooNew", "InvalidRange", "Error"):
        return variant, state
    raise AnswerError(f"unknown variant {variant}")
