"""Seeded random event streams: what real engines publish, including the input they get wrong.

A :class:`Profile` says which features a stream uses; :func:`generate` turns a profile and a seed into a list of
ops (events and queries) that is the same for the same arguments on every machine (``random.Random(seed)``).

Features: stored chains under a parent or at the root, parents that are missing (ParentNotFound), removes of
resident and unknown hashes, Cleared, several dp ranks, LoRA names, Eagle windows, token counts that are not
blocks x block_size (both shorter and longer), skipped event ids (a seq taken and never fed, as vLLM does), the
stale-hash pattern (a block removed and stored again with the same tokens under a new hash), and queries aimed at
every recovery outcome (Events, TreeDump with and without a start, TooNew, InvalidRange).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .ops import Cleared, Event, Op, Query, Removed, Stored

U63 = (1 << 63) - 1


@dataclass(frozen=True)
class Profile:
    """What a stream is made of. ``ranks`` are the dp ranks events are published on."""

    name: str
    worker_id: int = 7
    block_size: int = 4
    max_buffer_size: int = 24
    ranks: tuple[int, ...] = (0,)
    events: int = 160
    lora: bool = False
    eagle: bool = False
    mismatch: bool = False
    skips: bool = False
    cleared: bool = True
    # Cleared only while at most one rank holds blocks (so the ALL-stream/per-rank Cleared rule cannot differ).
    cleared_single_rank_only: bool = True
    # Store a child under a second copy of its parent's tokens (new hashes): deviation D3.
    dup_parent: bool = False
    # Store a second copy of a resident block (same parent, same tokens, new hash), then remove either: twins.
    twins: bool = False
    query_rate: float = 0.25
    clear_rate: float = 0.08
    # kvshm's LocalIndexer gets dp_rank=producer_rank (a per-rank stream, vLLM); ranks must then be (that rank,).
    producer_rank: int | None = None
    first_seq: int = 0


@dataclass
class _Block:
    hash: int
    tokens: tuple[int, ...]  # this block's window (block_size tokens)
    parent: int | None
    lora: str | None
    # Where the block sits in the tree: its parent's node and its own window (two resident hashes with the same
    # node are "twins": one tree node holds both).
    node: tuple[object, ...] = ()


@dataclass
class _Rank:
    resident: dict[int, _Block] = field(default_factory=dict)
    removed: list[_Block] = field(default_factory=list)
    # node -> the hash that first took it (1.6.1 keeps it as the node's hash); None once that one was removed.
    owners: dict[tuple[object, ...], int | None] = field(default_factory=dict)

    def add(self, b: _Block) -> None:
        self.resident[b.hash] = b
        self.owners.setdefault(b.node, b.hash)

    def drop(self, h: int) -> None:
        b = self.resident.pop(h)
        self.removed.append(b)
        if self.owners.get(b.node) == h:
            self.owners[b.node] = None


class _Gen:
    def __init__(self, p: Profile, seed: int) -> None:
        self.p = p
        self.seed = seed
        self.rng = random.Random(f"{p.name}:{seed}")
        self.seq = p.first_seq
        self.ranks = {r: _Rank() for r in p.ranks}
        self.fed: list[int] = []  # seqs actually handed to the indexers, in order
        self.used_hashes: set[int] = set()
        self.ops: list[Op] = []
        # Deviation id -> index of the first op from which that documented difference may show.
        self.marks: dict[str, int] = {}

    def fresh_hash(self) -> int:
        while True:
            # Mostly 63-bit, sometimes >= 2^63 (engines send signed i64; the trace carries u64).
            h = self.rng.randrange(1, 1 << 64) if self.rng.random() < 0.2 else self.rng.randrange(1, U63)
            if h not in self.used_hashes:
                self.used_hashes.add(h)
                return h

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(0, 1 << 20) for _ in range(n))

    def next_seq(self) -> int:
        if self.p.skips and self.fed and self.rng.random() < 0.06:
            self.seq += self.rng.choice((1, 1, 2, 5))  # ids taken and never fed
        s = self.seq
        self.seq += 1
        self.fed.append(s)
        return s

    def emit(self, ev: Event) -> None:
        self.ops.append(ev)

    def stored(self) -> None:
        p, rng = self.p, self.rng
        r = rng.choice(p.ranks)
        st = self.ranks[r]
        lora = rng.choice((None, None, "lora-a", "lora-b")) if p.lora else None
        parent: _Block | None = None
        roll = rng.random()
        if st.resident and roll < 0.55:
            candidates = list(st.resident.values())
            if p.twins:  # only under a node's first hash: the twin bug, not D2's pattern
                candidates = [b for b in candidates if st.owners.get(b.node) == b.hash] or candidates
            parent = rng.choice(candidates)
            lora = parent.lora
        n = rng.choice((1, 1, 2, 3, 4, 6))
        windows = [self.tokens(p.block_size) for _ in range(n)]
        if parent is not None and st.removed and rng.random() < 0.25:
            # Stale-hash pattern: a removed child of this parent comes back with the same tokens, new hash.
            gone = [b for b in st.removed if b.parent == parent.hash]
            if gone:
                windows[0] = rng.choice(gone).tokens
        hashes = [self.fresh_hash() for _ in range(n)]
        parent_hash = None if parent is None else parent.hash
        if parent is None and roll > 0.97 and st.removed:
            parent_hash = rng.choice(st.removed).hash  # ParentNotFound: the whole store is skipped
        elif parent is None and roll > 0.95:
            parent_hash = self.fresh_hash()
        eagle = p.eagle and rng.random() < 0.3
        flat = [t for w in windows for t in w]
        if eagle:
            flat.append(rng.randrange(0, 1 << 20))
        if p.mismatch and rng.random() < 0.2:
            kind = rng.randrange(4)
            if kind == 0 and len(flat) > p.block_size:
                flat = flat[: len(flat) - p.block_size]  # fewer windows than hashes
            elif kind == 1:
                flat = flat[: max(0, len(flat) - 1)]  # the last window is incomplete
            elif kind == 2:
                flat = flat + list(self.tokens(p.block_size))  # more windows than hashes
            else:
                flat = flat + [7]  # a partial window at the end
        seq = self.next_seq()
        is_eagle = True if eagle else rng.choice((None, False)) if p.eagle else None
        self.mark_twin_parent(st, parent_hash)
        self.emit(Stored(seq, r, tuple(flat), tuple(hashes), parent_hash, lora, is_eagle))
        # Track what the tree will hold (approximately: enough to pick plausible parents and removes).
        if parent_hash is None or parent_hash in st.resident:
            prev = parent_hash
            node: tuple[object, ...] = () if parent_hash is None else st.resident[parent_hash].node
            # Dynamo zips hashes with complete windows: only that many blocks are stored.
            complete = (len(flat) - (1 if eagle else 0)) // p.block_size
            for i, h in enumerate(hashes[: min(n, complete)]):
                window = windows[i] if i < len(windows) else ()
                node = (node, lora, window)
                st.add(_Block(h, window, prev, lora, node))
                prev = h
        if p.dup_parent and parent is not None and rng.random() < 0.3:
            # A second copy of the parent's tokens under a new hash at the same place, then a child under it.
            copy_hash = self.fresh_hash()
            grand = parent.parent
            toks = parent.tokens
            self.emit(Stored(self.next_seq(), r, toks, (copy_hash,), grand, parent.lora, None))
            child = self.fresh_hash()
            ctoks = self.tokens(p.block_size)
            self.emit(Stored(self.next_seq(), r, ctoks, (child,), copy_hash, parent.lora, None))
            self.marks.setdefault("D2", len(self.ops) - 1)
        if p.twins and st.resident and rng.random() < 0.3:
            b = rng.choice(list(st.resident.values()))
            if b.parent is None or b.parent in st.resident:
                twin = self.fresh_hash()
                self.mark_twin_parent(st, b.parent)
                self.emit(Stored(self.next_seq(), r, b.tokens, (twin,), b.parent, b.lora, None))
                st.add(_Block(twin, b.tokens, b.parent, b.lora, b.node))

    def mark_twin_parent(self, st: _Rank, parent_hash: int | None) -> None:
        """A store under a hash that is not its node's first hash (a second copy of the same tokens at the same
        place) is deviation D2's pattern."""
        if parent_hash is None or parent_hash not in st.resident:
            return
        if st.owners.get(st.resident[parent_hash].node) != parent_hash:
            self.marks.setdefault("D2", len(self.ops))

    def removed(self) -> None:
        rng = self.rng
        r = rng.choice(self.p.ranks)
        st = self.ranks[r]
        hashes: list[int] = []
        twins = [b for b in st.resident.values() if st.owners.get(b.node) != b.hash] if self.p.twins else []
        if twins and rng.random() < 0.6:
            b = rng.choice(twins)  # the second copy goes; the node's first hash (and its subtree) stays
            hashes.append(b.hash)
            st.drop(b.hash)
        elif st.resident:
            k = min(len(st.resident), rng.choice((1, 1, 2, 3)))
            for b in rng.sample(list(st.resident.values()), k):
                hashes.append(b.hash)
                st.drop(b.hash)
        if not hashes or rng.random() < 0.1:
            hashes.append(self.fresh_hash())  # BlockNotFound: best-effort, the rest still applies
        self.emit(Removed(self.next_seq(), r, tuple(hashes)))

    def cleared(self) -> bool:
        rng = self.rng
        holders = [r for r, st in self.ranks.items() if st.resident]
        if self.p.cleared_single_rank_only and len(holders) > 1:
            return False
        r = holders[0] if holders else rng.choice(self.p.ranks)
        if self.p.cleared_single_rank_only:
            self.ranks[r] = _Rank()
        else:
            if len(holders) > 1 or (holders and holders[0] != r):
                self.marks.setdefault("D1", len(self.ops))
            self.ranks = {k: _Rank() for k in self.ranks}  # kvshm's ALL-stream rule; see deviation D1
        self.emit(Cleared(self.next_seq(), r))
        return True

    def queries(self) -> None:
        rng = self.rng
        buf = self.fed[-self.p.max_buffer_size :] if self.p.max_buffer_size else []
        newest = self.fed[-1] if self.fed else 0
        for _ in range(rng.choice((1, 1, 2, 3))):
            kind = rng.randrange(9)
            q: Query
            if kind == 0:
                q = Query(None, None)
            elif kind == 1:
                q = Query(None, newest)
            elif kind == 2 and buf:
                q = Query(rng.choice(buf), None)
            elif kind == 3 and buf:
                s = rng.choice(buf)
                q = Query(s, rng.randrange(s, newest + 3))
            elif kind == 4:
                q = Query(0, newest)  # a cold start
            elif kind == 5 and buf and buf[0] > 0:
                q = Query(rng.randrange(0, buf[0]), newest)  # older than the buffer: a dump
            elif kind == 6:
                q = Query(newest + rng.randrange(1, 4), None)  # too new
            elif kind == 7:
                s = rng.randrange(0, newest + 2)
                q = Query(s + 1, s)  # end < start: InvalidRange
            else:
                s = rng.randrange(max(0, newest - 6), newest + 2)
                q = Query(s, newest)  # around the tail, maybe inside a skipped id
            self.ops.append(q)

    def run(self) -> Stream:
        p, rng = self.p, self.rng
        while len(self.fed) < p.events:
            roll = rng.random()
            if roll < 0.62:
                self.stored()
            elif roll < 1 - p.clear_rate or not p.cleared:
                self.removed()
            elif not self.cleared():
                self.removed()
            if rng.random() < p.query_rate:
                self.queries()
        self.ops.append(Query(None, None))
        self.ops.append(Query(0, self.fed[-1]))
        return Stream(p, self.seed, self.ops, self.marks)


@dataclass(frozen=True)
class Stream:
    """One generated stream. ``marks[id]`` is the index of the first op after which deviation ``id`` (a row of
    conformance/README.md's table) may explain a difference; before it, any difference is a failure."""

    profile: Profile
    seed: int
    ops: list[Op]
    marks: dict[str, int]

    def deviations_at(self, index: int) -> list[str]:
        return sorted(d for d, i in self.marks.items() if i <= index)


def generate(p: Profile, seed: int) -> Stream:
    """The ops of one stream: events in publish order with queries between them."""
    return _Gen(p, seed).run()


#: The differential streams run by ``make conformance`` (each with fresh seeds unless ``--seed`` pins them).
PROFILES: tuple[Profile, ...] = (
    Profile("basic"),
    Profile("tiny-buffer", max_buffer_size=4, block_size=2),
    Profile("lora-eagle", lora=True, eagle=True),
    Profile("mismatch", mismatch=True, eagle=True),
    Profile("skipped-ids", skips=True, first_seq=100),
    Profile("multi-rank", ranks=(0, 1, 2), lora=True),
    Profile("multi-rank-cleared", ranks=(0, 1), cleared_single_rank_only=False, query_rate=0.35),
    Profile("per-rank-stream", ranks=(2,), producer_rank=2, skips=True, mismatch=True),
    Profile("dup-parent", dup_parent=True, cleared=False),
    Profile("twins", twins=True),
    Profile("everything", ranks=(0, 1, 3), lora=True, eagle=True, mismatch=True, skips=True, max_buffer_size=12),
)
