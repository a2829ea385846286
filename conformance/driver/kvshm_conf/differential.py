"""kvshm against Dynamo 1.6.1 side by side on seeded random streams.

Every event goes to kvshm's ``LocalIndexer`` (a private kvshmd, the real daemon) and to the reference
``kvshm_conformance.LocalIndexer`` (the crate's ``LocalKvIndexer``) with the same arguments. Every query's pair of
answers is classified:

* ``identical``: the same bytes;
* ``same-state``: two fresh reference consumers, primed live with the same prefix of events (those before the
  query's start; every event so far for a query without a start), each fed one answer (each rank's share under its
  own key), end with the same canonical state and watermarks (the variants may differ: a TreeDump that rebuilds
  what the Events would have is as good for the consumer);
* a deviation id (conformance/README.md) when the stream had produced, before the query, the pattern that deviation
  is about, and both answers still leave the consumer at the same watermark;
* ``FAIL`` otherwise, and also when only one side refused an event's arguments.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable
from typing import Any, Protocol

import kvshm
import kvshm_conformance as ref

from .gen import Profile, Stream
from .ops import Event, Query, Removed, Stored
from .rebuild import rebuild
from .report import Row


class Indexer(Protocol):
    """The old extension's API, as both sides implement it."""

    def apply_stored(
        self,
        seq: int,
        token_ids: list[int],
        block_hashes: list[int],
        parent_hash: int | None = ...,
        dp_rank: int = ...,
        lora_name: str | None = ...,
        is_eagle: bool | None = ...,
    ) -> None: ...

    def apply_removed(self, seq: int, block_hashes: list[int], dp_rank: int = ...) -> None: ...

    def apply_cleared(self, seq: int, dp_rank: int = ...) -> None: ...

    def get_events_json(self, start: int | None = ..., end: int | None = ...) -> str: ...


def feed(ix: Indexer, ev: Event) -> str | None:
    """Apply one event; returns the exception's type name when the indexer refused it."""
    try:
        if isinstance(ev, Stored):
            ix.apply_stored(
                ev.seq, list(ev.tokens), list(ev.hashes), ev.parent, ev.dp_rank, ev.lora_name, ev.is_eagle
            )
        elif isinstance(ev, Removed):
            ix.apply_removed(ev.seq, list(ev.hashes), ev.dp_rank)
        else:
            ix.apply_cleared(ev.seq, ev.dp_rank)
    except (TypeError, ValueError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def variant(body: str) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return "unparseable"
    return next(iter(doc)) if isinstance(doc, dict) and doc else "unparseable"


def classify(stream: Stream, index: int, q: Query, fed: list[Event], ours: str, theirs: str) -> tuple[str, str]:
    """The outcome of one query (see the module doc) and a one-line detail for failures."""
    if ours == theirs:
        return "identical", ""
    p = stream.profile
    where = f"seed={stream.seed} op#{index} query(start={q.start}, end={q.end})"
    try:
        ref.parse_response(ours, "1.6.1")
    except ValueError as e:
        return "FAIL", f"{where}: kvshm's answer does not parse with 1.6.1's types: {e}: {ours[:200]}"
    prefix = fed if q.start is None else [ev for ev in fed if ev.seq < q.start]
    a = rebuild(p.worker_id, p.block_size, p.ranks, prefix, ours)
    b = rebuild(p.worker_id, p.block_size, p.ranks, prefix, theirs)
    if (a[0], a[2]) == (b[0], b[2]):  # state and watermarks (a TreeDump may stand for Events: same effect)
        return "same-state", ""
    devs = stream.deviations_at(index)
    if devs and a[2] == b[2]:  # a deviation is about content: the watermarks must still agree
        return devs[0], ""
    return "FAIL", (
        f"{where}: kvshm {variant(ours)} ({len(ours)} B) vs Dynamo {variant(theirs)} ({len(theirs)} B), "
        f"rebuilt states differ (variants {a[1]} vs {b[1]}, watermarks {a[2]} vs {b[2]}); "
        f"kvshm={ours[:160]} dynamo={theirs[:160]}"
    )


def run_stream(stream: Stream, row: Row, log: Callable[[str], None]) -> None:
    p = stream.profile
    per_rank: dict[str, Any] = {} if p.producer_rank is None else {"dp_rank": p.producer_rank}
    ours = kvshm.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size, **per_rank)
    theirs = ref.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size)
    try:
        fed: list[Event] = []
        for i, op in enumerate(stream.ops):
            if isinstance(op, Query):
                a = ours.get_events_json(op.start, op.end)
                b = theirs.get_events_json(op.start, op.end)
                outcome, detail = classify(stream, i, op, fed, a, b)
                row.add(outcome, detail)
                continue
            ea, eb = feed(ours, op), feed(theirs, op)
            if ea is not None or eb is not None:
                if (ea is None) != (eb is None):
                    row.add("FAIL", f"seed={stream.seed} op#{i} {op}: kvshm raised {ea}, Dynamo raised {eb}")
                else:
                    row.add("identical")  # both refused the arguments
                continue
            fed.append(op)
        log(f"  {p.name} seed={stream.seed}: {len(stream.ops)} ops")
    finally:
        ours.shutdown()
        theirs.shutdown()



#: Arguments the old extension took or refused (the drop-in's input contract): each call goes to both sides; both must
#: accept or both refuse it (TypeError for bytes, str and dict as hash lists; ValueError/OverflowError out of range).
INPUT_CALLS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("apply_stored", (0, [1, 2], [5])),
    ("apply_stored", (1, [3, 4], b"a")),
    ("apply_stored", (2, [3, 4], "a")),
    ("apply_stored", (3, [3, 4], {5: 1})),
    ("apply_stored", (4, [3, 4], (-1,))),
    ("apply_stored", (5, [5, 6], [2**64 - 1], -1)),
    ("apply_stored", (6, [5, 6], [2**64])),
    ("apply_stored", (7, [5, 6], [-(2**63) - 1])),
    ("apply_stored", (8, range(7, 11), array("q", [11, 12]), 5)),
    ("apply_stored", (9, [1, 2, 3], [13, 14], None, 0, "lora", None)),
    ("apply_stored", (10, [1, 2, 3, 4, 5], [15, 16], None, 1, None, True)),
    ("apply_stored", (11, [], [])),
    ("apply_removed", (12, b"ab")),
    ("apply_removed", (13, array("Q", [2**64 - 1]))),
    ("apply_removed", (14, [11, 999])),
    ("apply_removed", (15, [], 1)),
)


def run_inputs(row: Row) -> None:
    """The INPUT_CALLS on both sides, then every kind of query on what they kept."""
    p = Profile("input", worker_id=3, block_size=2, max_buffer_size=8)
    ours = kvshm.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size)
    theirs = ref.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size)
    try:
        for i, (method, args) in enumerate(INPUT_CALLS):
            errs: list[str | None] = []
            for ix in (ours, theirs):
                try:
                    getattr(ix, method)(*args)
                    errs.append(None)
                except (TypeError, ValueError, OverflowError) as e:
                    errs.append(type(e).__name__)
            if (errs[0] is None) != (errs[1] is None):
                row.add("FAIL", f"input #{i} {method}{args!r}: kvshm raised {errs[0]}, Dynamo raised {errs[1]}")
            else:
                row.add("identical")
        queries = [Query(None, None), Query(0, None), Query(9, 12), Query(20, None), Query(5, 4)]
        stream = Stream(p, 0, list(queries), {})
        for i, q in enumerate(queries):
            a, b = ours.get_events_json(q.start, q.end), theirs.get_events_json(q.start, q.end)
            outcome, detail = classify(stream, i, q, [], a, b)
            row.add(outcome, detail)
    finally:
        ours.shutdown()
        theirs.shutdown()
