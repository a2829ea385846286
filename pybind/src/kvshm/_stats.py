"""The shape of :meth:`kvshm.LocalIndexer.stats`: every key, its type and what it means, stated once here.

The local keys are always filled (no I/O). The daemon's keys (``incomplete``, ``lost_ranges``, ``missing``,
``token_mismatches``, ``zmq``, ``daemon_stream``) are None when the daemon was not asked (``stats(daemon=False)``),
is away, or does not know the stream yet.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["BatchStats", "IndexerStats", "LostRange"]


class LostRange(TypedDict):
    """Event ids kvshm lost, ``first`` to ``last`` inclusive (kvshmd's STATS, proto/sock/PROTOCOL.md)."""

    first: int
    last: int
    unknown: NotRequired[bool]  # the history before a resumed ring, ids unknown
    reason: NotRequired[str]  # why: ring full, corrupt record, unknown history, ...


class BatchStats(TypedDict):
    """``apply_batch``'s own counters."""

    batches: int  # apply_batch calls that published something
    events: int  # events in all batches
    records: int  # BATCH records written (one per batch)
    records_dropped: int  # BATCH records the ring refused (full, too large): a loss of their seq
    fallback_batches: int  # batches published event by event (the daemon does not read BATCH records)
    fallback_meta_dropped: int  # events whose metadata such a fallback could not carry
    fallback_not_indexed: int  # events a fallback skipped (the daemon's index would not apply them)
    fields_dropped: int  # events published without a field BATCH records cannot carry (kvshm.events)


class IndexerStats(TypedDict):
    """What :meth:`kvshm.LocalIndexer.stats` returns."""

    worker_id: int
    dp_rank: int | None  # the indexer's rank; None: it publishes for every rank of the worker
    kv_block_size: int
    max_buffer_size: int
    mode: Literal["shared", "private"]  # a daemon somebody else runs, or this process's own
    socket_path: str  # the daemon's Unix socket
    ring_path: str  # the ring file (/proc/<pid>/fd/<n> for a memfd ring)
    closed: bool  # shutdown() ran
    attached: bool  # the daemon holds this producer's ATTACH now
    attaches: int  # successful ATTACHes, the first included
    daemon_pid: int | None  # the private daemon's pid; None with a shared daemon
    daemon_restarts: int  # private daemons restarted after they died
    last_attach: dict[str, Any]  # the daemon's last ATTACH reply: epoch, stream_epoch, resumed, head, ...
    last_error: str | None  # why the last attach or query failed
    published_events: int | None  # events written into the ring (None once closed)
    dropped_events: int | None  # events the ring refused (full, too large): the daemon reports them lost
    published_while_detached: int  # publish calls made while no daemon was attached
    ring_truncated: bool  # the ring file was cut short: every publish is dropped
    ring: dict[str, Any]  # the ring's own counters (positions, usage, drops); empty once closed
    incomplete: bool | None  # answers miss events kvshm lost (ring full, corrupt record, unknown history)
    lost_ranges: list[LostRange] | None  # every loss of the stream, newest last
    missing: list[LostRange] | None  # the losses an incomplete answer misses (since the last Cleared)
    token_mismatches: int | None  # Stored events whose token count was not blocks x kv_block_size
    batches_supported: bool  # the daemon reads BATCH records (its ATTACH reply said so)
    publishing: bool | None  # the daemon publishes this stream on ZMQ (its ATTACH reply; None before one)
    publish: dict[str, Any] | None  # the ZmqPublish this indexer asked for, as sent in ATTACH
    zmq: dict[str, Any] | None  # the daemon's ZMQ counters of this stream
    batch: BatchStats
    daemon_stream: dict[str, Any] | None  # the daemon's whole STATS entry for this stream
