"""Batches side by side: several events under one event id, as Dynamo's ZMQ listener feeds a worker's indexer.

A ZMQ batch's seq is the event id of every event in it (the batch-seq decision, docs/decisions.md): 1.6.1's listener
hands each event of batch ``seq`` to the worker's ``LocalKvIndexer`` with ``event_id = seq``, so its buffer holds
several events with one id and ``get_events_json`` answers by id. The streams here are :func:`gen.generate` streams
regrouped into batches (1..4 consecutive events of one dp rank; a query closes the open batch), renumbered one seq per
batch (with a skipped seq now and then when the profile skips ids), their queries mapped onto the new numbering (a seq
inside a batch to the batch's, one past the newest stays past the newest).

Each batch goes to kvshm as ONE call, ``LocalIndexer.apply_batch(seq, events, dp_rank=r)`` with vLLM-shaped events
(:mod:`vllm_ref`'s msgspec Structs, as vLLM's own pass; every other batch as ``kvshm.events``' dataclasses), and to
the reference ``kvshm_conformance.LocalIndexer`` event by event with the batch's seq. Every query's pair of answers is
classified as in :mod:`differential` (identical / same state / documented deviation / FAIL); the consumers that
rebuild an answer are primed batch by batch (:func:`rebuild.rebuild` applies a run of events sharing a seq as one live
batch).
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Callable
from typing import Any

import kvshm
import kvshm_conformance as ref

from .differential import classify, feed
from .gen import Profile, Stream, generate
from .ops import U64, Cleared, Event, Op, Query, Removed, Stored
from .rebuild import Follower, rebuild
from .report import Row
from .vllm_ref import AllBlocksCleared, BlockRemoved, BlockStored, VllmEvent

#: Streams without Eagle windows or token counts off the block grid (vLLM's BlockStored has no is_eagle; its token
#: list is always blocks x block_size).
BATCH_PROFILES: tuple[Profile, ...] = (
    Profile("batch-basic"),
    Profile("batch-tiny-buffer", max_buffer_size=4, block_size=2),
    Profile("batch-multi-rank", ranks=(0, 1, 2), lora=True, skips=True),
    Profile("batch-per-rank", ranks=(2,), producer_rank=2, lora=True),
    Profile("batch-twins", twins=True, dup_parent=True, cleared=False),
)


def _retag(ev: Event, seq: int) -> Event:
    if isinstance(ev, Stored):
        return Stored(seq, ev.dp_rank, ev.tokens, ev.hashes, ev.parent, ev.lora_name, ev.is_eagle)
    if isinstance(ev, Removed):
        return Removed(seq, ev.dp_rank, ev.hashes)
    return Cleared(seq, ev.dp_rank)


def batched(p: Profile, seed: int) -> Stream:
    """The profile's stream regrouped into batches (module doc); events of a batch share their seq."""
    src = generate(p, seed)
    rng = random.Random(f"batches:{p.name}:{seed}")
    ops: list[Op] = []
    index_of: list[int] = []  # source op index -> index in ops of its first derived op
    seq = p.first_seq
    new_of: dict[int, int] = {}  # source seq -> batch seq
    open_rank: int | None = None
    open_left = 0
    pending_queries: list[tuple[int, Query]] = []
    for op in src.ops:
        index_of.append(len(ops))
        if isinstance(op, Query):
            open_rank, open_left = None, 0
            pending_queries.append((len(ops), op))
            ops.append(op)
            continue
        if open_rank != op.dp_rank or open_left == 0:
            if open_rank is not None or ops:
                seq += 1
                if p.skips and rng.random() < 0.06:
                    seq += rng.choice((1, 2, 5))
            open_rank, open_left = op.dp_rank, rng.choice((1, 2, 2, 3, 4))
        open_left -= 1
        new_of[op.seq] = seq
        ops.append(_retag(op, seq))
    src_seqs = sorted(new_of)
    newest_src, newest = (src_seqs[-1], new_of[src_seqs[-1]]) if src_seqs else (0, 0)

    def remap(s: int | None) -> int | None:
        if s is None:
            return None
        if s in new_of:
            return new_of[s]
        if s > newest_src:
            return newest + (s - newest_src)
        k = bisect.bisect_left(src_seqs, s)
        return new_of[src_seqs[k]] if k < len(src_seqs) else newest + 1

    for at, q in pending_queries:
        ops[at] = Query(remap(q.start), remap(q.end))
    marks = {d: index_of[i] if i < len(index_of) else len(ops) for d, i in src.marks.items()}
    return Stream(p, seed, ops, marks)


def vllm_event(ev: Event, block_size: int) -> VllmEvent:
    if isinstance(ev, Stored):
        return BlockStored(
            [h % U64 for h in ev.hashes], None if ev.parent is None else ev.parent % U64, list(ev.tokens),
            block_size, None, "GPU", ev.lora_name,
        )
    if isinstance(ev, Removed):
        return BlockRemoved([h % U64 for h in ev.hashes], "GPU")
    return AllBlocksCleared()


def kvshm_event(e: VllmEvent) -> Any:
    """The same event as ``kvshm.events``' slots dataclass (its fields are vLLM's)."""
    from kvshm import events as kev

    cls = getattr(kev, type(e).__name__)
    return cls(**{f: getattr(e, f) for f in e.__struct_fields__})


def truth_state(p: Profile, fed: list[Event]) -> str:
    """A consumer that saw every batch live (one per rank key)."""
    f = Follower(p.worker_id, p.block_size)
    run: list[Event] = []
    for ev in fed + [Cleared(-1, -1)]:  # a sentinel closes the last run
        if run and (run[0].seq, run[0].dp_rank) != (ev.seq, ev.dp_rank):
            f.live_batch(run[0].dp_rank, run[0].seq, run)
            run = []
        run.append(ev)
    return f.state()


def partial_start_batch(q: Query, fed: list[Event], ours: str, theirs: str) -> bool:
    """Deviation D7's pattern: both answer Events with one ``last_event_id``; Dynamo's events are kvshm's minus a
    non-empty prefix, and that prefix is events of the batch ``q.start`` names (1.6.1's binary search over equal
    ids landed inside that batch)."""
    if q.start is None or sum(1 for ev in fed if ev.seq == q.start) < 2:
        return False
    try:
        a, b = json.loads(ours), json.loads(theirs)
    except ValueError:
        return False
    if not (isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b) == {"Events"}):
        return False
    ea, eb = a["Events"]["events"], b["Events"]["events"]
    if a["Events"]["last_event_id"] != b["Events"]["last_event_id"] or not 0 < len(eb) < len(ea) + 1:
        return False
    k = len(ea) - len(eb)
    return k > 0 and ea[k:] == eb and all(e["event"]["event_id"] == q.start for e in ea[:k])


def evicted_start_batch(q: Query, fed: list[Event], ours: str, theirs: str) -> bool:
    """Deviation D8's pattern: kvshm answers a TreeDump, Dynamo ``Events`` that start with some but not all of the
    events of the batch ``q.start`` names (1.6.1's buffer evicted the rest of that batch event by event; kvshm's
    log evicts a batch whole, so the start id is older than its log)."""
    if q.start is None:
        return False
    try:
        a, b = json.loads(ours), json.loads(theirs)
    except ValueError:
        return False
    if not (isinstance(a, dict) and isinstance(b, dict) and set(a) == {"TreeDump"} and set(b) == {"Events"}):
        return False
    eb = b["Events"]["events"]
    kept = sum(1 for e in eb if e["event"]["event_id"] == q.start)
    return bool(eb) and eb[0]["event"]["event_id"] == q.start and 0 < kept < sum(1 for ev in fed if ev.seq == q.start)


def judge(stream: Stream, index: int, q: Query, fed: list[Event], ours: str, theirs: str) -> tuple[str, str]:
    """:func:`differential.classify`, and deviations D7 and D8 (conformance/README.md) when 1.6.1 answered part of
    the start batch (from inside it: D7; what its buffer kept of it: D8) while kvshm's answer (the whole batch on;
    a dump) rebuilds what a live consumer holds."""
    outcome, detail = classify(stream, index, q, fed, ours, theirs)
    if outcome != "FAIL":
        return outcome, detail
    if partial_start_batch(q, fed, ours, theirs):
        dev = "D7"
    elif evicted_start_batch(q, fed, ours, theirs):
        dev = "D8"
    else:
        return outcome, detail
    p = stream.profile
    assert q.start is not None
    prefix = [ev for ev in fed if ev.seq < q.start] if dev == "D7" else []
    rebuilt = rebuild(p.worker_id, p.block_size, p.ranks, prefix, ours)[0]
    if rebuilt == truth_state(p, fed):
        return dev, ""
    return "FAIL", detail + f"; kvshm's answer ({dev}'s pattern) does not rebuild the live consumer's state either"


def run_batched_stream(stream: Stream, row: Row, log: Callable[[str], None]) -> None:
    p = stream.profile
    per_rank: dict[str, Any] = {} if p.producer_rank is None else {"dp_rank": p.producer_rank}
    ours = kvshm.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size, **per_rank)
    theirs = ref.LocalIndexer(p.worker_id, p.block_size, p.max_buffer_size)
    try:
        fed: list[Event] = []
        batch: list[Event] = []

        def flush(at: int) -> None:
            if not batch:
                return
            seq, rank = batch[0].seq, batch[0].dp_rank
            events: list[Any] = [vllm_event(ev, p.block_size) for ev in batch]
            if seq % 2:  # every other batch as kvshm's own event classes (no msgspec)
                events = [kvshm_event(e) for e in events]
            try:
                ours.apply_batch(seq, events, dp_rank=rank)
                err = None
            except (TypeError, ValueError, OverflowError) as e:
                err = f"{type(e).__name__}: {e}"
            errs = [feed(theirs, ev) for ev in batch]
            if err is not None or any(errs):
                row.add("FAIL", f"seed={stream.seed} batch at op#{at} seq={seq}: kvshm raised {err}, Dynamo {errs}")
            fed.extend(batch)
            batch.clear()

        for i, op in enumerate(stream.ops):
            if isinstance(op, Query):
                flush(i)
                a = ours.get_events_json(op.start, op.end)
                b = theirs.get_events_json(op.start, op.end)
                outcome, detail = judge(stream, i, op, fed, a, b)
                row.add(outcome, detail)
                continue
            if batch and (batch[0].seq != op.seq or batch[0].dp_rank != op.dp_rank):
                flush(i)
            batch.append(op)
        flush(len(stream.ops))
        log(f"  {p.name} seed={stream.seed}: {len(stream.ops)} ops, {len({ev.seq for ev in fed})} batches")
    finally:
        ours.shutdown()
        theirs.shutdown()
