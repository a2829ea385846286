"""``LocalIndexer``: the engine-facing, drop-in replacement for the ``kv_local_indexer`` extension.

The engine's thread calls ``apply_stored`` / ``apply_removed`` / ``apply_cleared`` once per event (``seq`` is the
event id). Each call validates its arguments (programmer errors raise ``TypeError`` / ``ValueError`` before
anything is written), encodes the event as a FlatBuffer straight into this process's shared-memory ring and
publishes it with one 8-byte store: no system call, no socket I/O, no waiting. kvshmd drains the ring, keeps the
radix tree and the event log, and answers ``get_events_json`` over its Unix socket with Dynamo's
``WorkerKvQueryResponse`` JSON.

The daemon side (a private kvshmd or a shared one, the ATTACH connection, reattaching, losses) lives in
:mod:`kvshm._supervisor`; :meth:`LocalIndexer.stats` returns a :class:`kvshm.IndexerStats` (its keys:
:mod:`kvshm._stats`).

Inputs are the old extension's (Dynamo 1.6.1 decides what they mean): a token count that is not blocks x
kv_block_size is published as given and hashed by the daemon as Dynamo does (complete windows zipped with the
hashes); numpy integer scalars and arrays are taken wherever ints and id lists are (see :mod:`kvshm._coerce`);
``bytes``, ``str`` and mappings are refused as id lists. With ``dp_rank=r`` the indexer is the producer of one
attention-DP rank (kvshmd keeps a stream per ``(worker_id, r)``), and an event of another rank is refused.

Concurrency: publishing is serialized by a lock (uncontended, no system call), so any number of threads may
publish; queries use their own connections (a small pool, so a slow dump does not hold up a quick Events query).
The supervisor thread owns the ATTACH connection and the daemon's restarts. A process forked from the owner gets
:class:`ForkedProcessError` from every method: the ring, its lock and the daemon belong to the parent.
"""

from __future__ import annotations

import operator
import os
import time
import weakref
from collections.abc import Sequence
from typing import Any, Final, SupportsIndex

from ._batch import ZmqPublish
from ._batchrec import prepare_batch
from ._encode import IntSequence
from ._stats import BatchStats, IndexerStats
from ._supervisor import CLOSED, FORKED, OPEN, Core

__all__ = ["LocalIndexer"]


SOCKET_ENV: Final = "KVSHM_SOCKET"
RING_DIR_ENV: Final = "KVSHM_RING_DIR"
RING_BYTES_ENV: Final = "KVSHM_RING_BYTES"
DP_RANK_ENV: Final = "KVSHM_DP_RANK"
# 64 MiB: a daemon paused for 30 s under 200 Stored events/s of 32 blocks x 32 tokens (~4.5 KB each, ~27 MB in all)
# loses nothing, with room left for the private daemon's checkpoint hold-back (it releases ring space only up to a
# checkpoint, and checkpoints when applied records fill half the ring).
DEFAULT_RING_BYTES: Final = 64 << 20

_U32: Final = 1 << 32
_U64: Final = 1 << 64


class LocalIndexer:
    """A worker's KV-event memory: publish events, answer the global indexer's recovery queries.

    ``worker_id`` (u64) is stamped on every event of the answers, ``kv_block_size`` (tokens per block, >= 1)
    defines the token windows, ``max_buffer_size`` the number of recent events kept for ``Events`` answers.
    ``socket_path`` (or ``$KVSHM_SOCKET``) selects a shared kvshmd instead of a private one; ``ring_dir``
    (``$KVSHM_RING_DIR``, default ``/dev/shm``) and ``ring_bytes`` (``$KVSHM_RING_BYTES``, default 64 MiB) place
    and size the shared-memory ring.

    ``dp_rank`` (or ``$KVSHM_DP_RANK``) makes this the producer of one attention-DP rank of the worker (vLLM: one
    publisher per rank, each with its own event ids): kvshmd keeps a separate stream for ``(worker_id, dp_rank)``
    and ``get_events_json`` answers for that rank only, so several such indexers share one daemon. Events default
    to that rank; one published with another ``dp_rank`` raises ``ValueError`` (a programmer error: the stream
    stands for one rank). Without it (the default, TensorRT-LLM) the indexer publishes for every rank of the
    worker, and a second live producer of the same ``worker_id`` is refused by a shared daemon.

    Raises ``TypeError``/``ValueError`` for bad arguments, :class:`kvshm.LauncherError` when no private kvshmd can
    be started (with its output), :class:`kvshm.KvshmError` when a daemon refuses the ring for a reason retrying
    cannot fix, :class:`kvshm.RingError` (or ``OSError``) when the ring cannot be created (for example a full
    ``/dev/shm``). A shared daemon that is not reachable yet is not an error: the indexer attaches when it is.
    """

    __slots__ = ("_core", "_ring", "_dp", "_scoped", "_finalizer", "__weakref__")

    # Note for maintainers: apply_stored/removed/cleared are the hot path measured by bench/; apply_batch adds
    # nothing to them.

    def __init__(
        self,
        worker_id: SupportsIndex,
        kv_block_size: SupportsIndex,
        max_buffer_size: SupportsIndex = 10000,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        ring_dir: str | os.PathLike[str] | None = None,
        ring_bytes: int | None = None,
        dp_rank: SupportsIndex | None = None,
        publish: ZmqPublish | None = None,
    ) -> None:
        worker_id = _int_in(worker_id, "worker_id", 0, _U64)
        if publish is not None and not isinstance(publish, ZmqPublish):
            raise TypeError(f"kvshm: publish must be a kvshm.ZmqPublish or None, not {type(publish).__name__}")
        kv_block_size = _int_in(kv_block_size, "kv_block_size", 1, _U32)
        max_buffer_size = _int_in(max_buffer_size, "max_buffer_size", 0, _U32)
        if socket_path is None:
            socket_path = os.environ.get(SOCKET_ENV) or None
        if ring_dir is None:
            ring_dir = os.environ.get(RING_DIR_ENV) or None
        if ring_bytes is None:
            env = os.environ.get(RING_BYTES_ENV)
            ring_bytes = _parse_size(env, RING_BYTES_ENV) if env else DEFAULT_RING_BYTES
        else:
            ring_bytes = _int_in(ring_bytes, "ring_bytes", 1, _U64)
        if dp_rank is None:
            env = os.environ.get(DP_RANK_ENV, "").strip()
            if env:
                if not env.isdigit():
                    raise ValueError(f"kvshm: {DP_RANK_ENV}={env!r} is not a dp rank (an integer in [0, 2**32))")
                dp_rank = _int_in(int(env), DP_RANK_ENV, 0, _U32)
        else:
            dp_rank = _int_in(dp_rank, "dp_rank", 0, _U32)
        if publish is not None:
            publish = publish.for_rank(dp_rank)  # vLLM's port offset (ValueError for ipc:// with a rank > 0)
        core = Core(
            worker_id,
            kv_block_size,
            max_buffer_size,
            None if socket_path is None else os.fspath(socket_path),
            None if ring_dir is None else os.fspath(ring_dir),
            ring_bytes,
            dp_rank,
            publish,
        )
        try:
            core.start()
        except BaseException:
            core.close()
            raise
        self._core = core
        self._ring = core.ring
        self._dp = 0 if dp_rank is None else dp_rank  # the dp_rank of events published without one
        self._scoped = dp_rank is not None  # a per-rank producer: events of other ranks are refused
        # Runs on garbage collection of this object or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, core.close)

    # -- publishing (hot path) ----------------------------------------------------------------------------
    def apply_stored(
        self,
        seq: SupportsIndex,
        token_ids: IntSequence,
        block_hashes: IntSequence,
        parent_hash: SupportsIndex | None = None,
        dp_rank: SupportsIndex | None = None,
        lora_name: str | None = None,
        is_eagle: bool | None = None,
    ) -> None:
        """Publish a Stored event: ``block_hashes`` chained under ``parent_hash`` (None: a root chain).

        ``token_ids`` normally holds ``kv_block_size`` tokens per block (Eagle: ``len(block_hashes) *
        kv_block_size + 1``, the windows overlapping by one token). Any other count is published as given, never
        refused: kvshmd hashes the complete token windows and pairs them with the hashes (the shorter list decides
        how many blocks are stored), as Dynamo does, and counts the event in ``stats()["token_mismatches"]``.
        Hashes may be negative (signed i64): they are taken as u64 two's complement. Integers may be numpy
        integers, and id lists numpy arrays; ``dp_rank`` None means the indexer's own rank (0 without one).
        Raises TypeError/ValueError for bad arguments before anything is written; never blocks and never raises
        because the ring is full or the daemon is away (the drop is counted).
        """
        core = self._core
        if core.state:
            core.raise_unusable()
        if is_eagle is None or is_eagle is False:
            eagle = False
        elif is_eagle is True:
            eagle = True
        else:
            raise TypeError(f"kvshm: is_eagle must be a bool or None, not {type(is_eagle).__name__}")
        if dp_rank is None:
            dp_rank = self._dp
        elif self._scoped and dp_rank != self._dp:
            self._wrong_rank(dp_rank)
        if lora_name is not None and lora_name.__class__ is not str:
            raise TypeError(f"kvshm: lora_name must be a str or None, not {type(lora_name).__name__}")
        lock = core.lock  # acquire/release: ~75 ns cheaper than `with` on this path
        lock.acquire()
        try:
            if core.state:
                core.raise_unusable()
            # A False return (dropped: ring full) is counted by the ring itself.
            self._ring.publish_stored(seq, token_ids, block_hashes, parent_hash, dp_rank, lora_name, eagle)
            if not core.attached:
                core.published_detached += 1
        finally:
            lock.release()

    def apply_removed(
        self, seq: SupportsIndex, block_hashes: IntSequence, dp_rank: SupportsIndex | None = None
    ) -> None:
        """Publish a Removed event for ``block_hashes`` (negative hashes taken as u64). Same arguments rules and
        guarantees as :meth:`apply_stored`."""
        core = self._core
        if core.state:
            core.raise_unusable()
        if dp_rank is None:
            dp_rank = self._dp
        elif self._scoped and dp_rank != self._dp:
            self._wrong_rank(dp_rank)
        lock = core.lock  # acquire/release: ~75 ns cheaper than `with` on this path
        lock.acquire()
        try:
            if core.state:
                core.raise_unusable()
            self._ring.publish_removed(seq, block_hashes, dp_rank)
            if not core.attached:
                core.published_detached += 1
        finally:
            lock.release()

    def apply_cleared(self, seq: SupportsIndex, dp_rank: SupportsIndex | None = None) -> None:
        """Publish a Cleared event: the worker dropped every block this indexer publishes for (all dp_ranks of
        the worker; with ``dp_rank=`` given to the constructor, that rank). Same guarantees as
        :meth:`apply_stored`."""
        core = self._core
        if core.state:
            core.raise_unusable()
        if dp_rank is None:
            dp_rank = self._dp
        elif self._scoped and dp_rank != self._dp:
            self._wrong_rank(dp_rank)
        lock = core.lock  # acquire/release: ~75 ns cheaper than `with` on this path
        lock.acquire()
        try:
            if core.state:
                core.raise_unusable()
            self._ring.publish_cleared(seq, dp_rank)
            if not core.attached:
                core.published_detached += 1
        finally:
            lock.release()

    def apply_batch(
        self,
        seq: SupportsIndex,
        events: Sequence[Any],
        ts: float | None = None,
        dp_rank: SupportsIndex | None = None,
    ) -> None:
        """Publish one engine batch of KV events under one ``seq`` (the batch's event id: every event of it gets
        this id in kvshm's index and on the ZMQ stream, as Dynamo numbers a vLLM batch).

        ``events``: vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` objects (recognized by class
        name, read by vLLM's attribute names: vLLM's msgspec objects pass as they are) or
        :mod:`kvshm.events`' dataclasses. ``ts`` is the engine's ``time.time()`` for the batch (None: now);
        ``dp_rank`` None means the indexer's own rank. An empty ``events`` publishes nothing. Block hashes are ints
        or, as vLLM sends them with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, ``bytes`` (all of an event's one
        length): published as msgpack bin, as vLLM does, and indexed under their last 8 bytes, big-endian (the int
        vLLM would send for the same hash; Dynamo's rule where it decodes bytes hashes, 1.6.1 does not).

        With a kvshmd that reads BATCH records (its ATTACH reply says ``"batches": true``) the batch is one ring
        record, atomic for the daemon, carrying vLLM's metadata (medium, lora_id, block_size, extra_keys,
        group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window) for the ZMQ stream. Otherwise (an older or
        not yet attached daemon) each event the daemon's index would apply is published like ``apply_stored`` /
        ``apply_removed`` / ``apply_cleared`` with ``seq``, the metadata is dropped, and both are counted in
        ``stats()["batch"]``; such a daemon takes the 2nd..kth event of a batch as an id reset.

        Same guarantees as :meth:`apply_stored`: TypeError/ValueError for bad arguments before anything is written
        (extra_keys need msgspec: TypeError naming it); never blocks; never raises because the ring is full (a
        batch that does not fit, or is larger than the ring's record limit, is dropped whole and its seq counted
        as lost) or the daemon is away.
        """
        core = self._core
        if core.state:
            core.raise_unusable()
        if dp_rank is None:
            dp = self._dp
        else:
            if self._scoped and dp_rank != self._dp:
                self._wrong_rank(dp_rank)
            dp = _int_in(dp_rank, "dp_rank", 0, _U32)
        if seq.__class__ is not int or not 0 <= seq < _U64:
            seq = _int_in(seq, "seq", 0, _U64)
        if ts is None:
            ts = time.time()
        elif isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise TypeError(f"kvshm: ts must be a float (time.time()) or None, not {type(ts).__name__}")
        ts = float(ts)
        if isinstance(events, (str, bytes)) or not hasattr(events, "__len__"):
            raise TypeError(f"kvshm: events must be a sequence of events, not {type(events).__name__}")
        if not events:
            return
        ring = self._ring
        lock = core.lock
        lock.acquire()
        try:
            if core.state:
                core.raise_unusable()
            batcher = core.batcher
            if core.batches_ok:
                subs, _ = batcher.subs(seq, dp, events)  # raises before anything is written
                if ring.publish_batch(prepare_batch(seq, dp, ts, subs)):
                    core.batch_records += 1
                else:
                    core.batch_records_dropped += 1
            else:
                prepared = [batcher.fallback(e, seq, dp) for e in events]  # raises before writing
                with_meta = sum(1 for e in events if _has_meta(e))
                for p in prepared:
                    if p is None:
                        core.fallback_not_indexed += 1
                    else:
                        ring.publish_prepared(p)
                core.batches_fallback += 1
                core.fallback_meta_dropped += with_meta
            core.batches += 1
            core.batch_events += len(events)
            if not core.attached:
                core.published_detached += 1
        finally:
            lock.release()

    def _wrong_rank(self, dp_rank: object) -> None:
        """Raises for an event whose dp_rank differs from a per-rank indexer's: TypeError when it is not an
        integer, else ValueError (publishing it would mix ranks in a stream that stands for one)."""
        if isinstance(dp_rank, bool):
            raise TypeError("kvshm: dp_rank must be an int, not bool")
        try:
            rank = operator.index(dp_rank)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"kvshm: dp_rank must be an int, not {type(dp_rank).__name__}") from None
        if rank != self._dp:
            raise ValueError(
                f"kvshm: this LocalIndexer publishes for dp_rank {self._dp} only (constructed with dp_rank="
                f"{self._dp}), not {rank}: create one LocalIndexer per rank, or one without dp_rank for all ranks"
            )

    # -- queries ------------------------------------------------------------------------------------------
    def get_events_json(self, start: SupportsIndex | None = None, end: SupportsIndex | None = None) -> str:
        """The recovery query: Dynamo's ``WorkerKvQueryResponse`` JSON for ids ``[start, end]``.

        ``Events`` (the suffix from ``start`` to the newest event), ``TreeDump`` (``start`` None or older than the
        buffer), ``TooNew``, ``InvalidRange``, or ``{"Error": "kvshm: ..."}`` when the daemon is away or
        restarting (or, with ``kvshmd --on-loss=error``, when the answer would miss events kvshm lost; by default
        such an answer is given and ``stats()["incomplete"]`` says so). With ``dp_rank=`` given to the
        constructor: that rank's stream. Only bad arguments raise.
        """
        core = self._core
        if core.state:
            core.raise_unusable()
        if start is not None:
            start = _int_in(start, "start", 0, _U64)
        if end is not None:
            end = _int_in(end, "end", 0, _U64)
        return core.events_json(start, end)

    def stats(self, *, daemon: bool = True) -> IndexerStats:
        """Counters and state (every key: :class:`kvshm.IndexerStats`): the local ones (publishes, drops,
        attachment, ring fill) and what the daemon knows of this producer's stream (one STATS round trip on the
        Unix socket, bounded by a 2 s deadline; with ``daemon=False`` none: local fields only, no I/O, for tight
        loops or a daemon that may be stopped). The daemon's keys are None when it is away or not asked. Never
        raises because the daemon is unreachable.
        """
        core = self._core
        if core.state == FORKED:
            core.raise_unusable()
        with core.lock:
            detached = core.published_detached
            ring = dict(self._ring.stats()) if core.state == OPEN else {}
            batch: BatchStats = {
                "batches": core.batches,
                "events": core.batch_events,
                "records": core.batch_records,
                "records_dropped": core.batch_records_dropped,
                "fallback_batches": core.batches_fallback,
                "fallback_meta_dropped": core.fallback_meta_dropped,
                "fallback_not_indexed": core.fallback_not_indexed,
                "fields_dropped": core.batcher.fields_dropped,
            }
        proc = core.daemon
        stream = core.daemon_stream() if daemon and core.state == OPEN else None
        return {
            "worker_id": core.worker_id,
            "dp_rank": core.dp_rank,
            "kv_block_size": core.kv_block_size,
            "max_buffer_size": core.max_buffer_size,
            "mode": "shared" if core.shared else "private",
            "socket_path": core.socket_path,
            "ring_path": core.ring.path,
            "closed": core.state == CLOSED,
            "attached": core.attached,
            "attaches": core.attaches,
            "daemon_pid": None if proc is None else proc.pid,
            "daemon_restarts": core.daemon_restarts,
            "last_attach": dict(core.attach_reply),  # the daemon's ATTACH reply: epoch, stream_epoch, resumed, head
            "last_error": core.last_error,
            "published_events": ring.get("published_events"),
            "dropped_events": ring.get("dropped_events"),
            "published_while_detached": detached,
            "ring_truncated": core.ring_truncated,  # the ring file was cut short: every publish is dropped
            "ring": ring,
            "incomplete": None if stream is None else stream.get("incomplete"),
            "lost_ranges": None if stream is None else stream.get("lost_ranges"),
            "missing": None if stream is None else stream.get("missing"),  # what incomplete answers miss
            "token_mismatches": None if stream is None else stream.get("token_mismatches"),
            # ZMQ publishing: the daemon reads BATCH records / publishes this stream (from the ATTACH reply), the
            # ZMQ counters of the daemon's STATS, and apply_batch's own counters.
            "batches_supported": core.batches_ok,
            "publishing": core.attach_reply.get("publishing"),
            "publish": None if core.publish is None else core.publish.to_json(),
            "zmq": None if stream is None else stream.get("zmq"),
            "batch": batch,
            "daemon_stream": stream,
        }

    def shutdown(self) -> None:
        """Stop publishing and tear down the private daemon, its socket and directory, and the ring file.
        Idempotent. With a shared daemon: DETACH (it applies what was published and keeps the index queryable)."""
        core = self._core
        if core.state == FORKED:
            core.raise_unusable()
        self._finalizer()

    def __enter__(self) -> LocalIndexer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        core = self._core
        state = {OPEN: "open", CLOSED: "closed", FORKED: "forked"}[core.state]
        return (
            f"LocalIndexer(worker_id={core.worker_id}, kv_block_size={core.kv_block_size}, "
            f"max_buffer_size={core.max_buffer_size}, "
            + ("" if core.dp_rank is None else f"dp_rank={core.dp_rank}, ")
            + f"{state}, "
            f"{'shared' if core.shared else 'private'} daemon at {core.socket_path!r})"
        )


def _has_meta(e: Any) -> bool:
    """Whether an event carries metadata a single EVENT record cannot express (it stands for medium "GPU" and
    nothing else), which a per-event fallback therefore drops."""
    if e.__class__.__name__ == "AllBlocksCleared":
        return False
    hashes: Any = getattr(e, "block_hashes", None)
    return getattr(e, "medium", None) != "GPU" or any(
        getattr(e, f, None) is not None
        for f in ("lora_id", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
    ) or bool(hashes) and hashes[0].__class__ is bytes or getattr(e, "parent_block_hash", None).__class__ is bytes


def _int_in(value: object, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in [lo, hi); TypeError for non-integers (bool included), ValueError when out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"kvshm: {name} must be an int, not {type(value).__name__}")
        value = value.__index__()
        assert isinstance(value, int)
    if not lo <= value < hi:
        raise ValueError(f"kvshm: {name} {value} is out of range [{lo}, {hi})")
    return value


_SIZE_SUFFIX: Final = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}


def _parse_size(text: str, name: str) -> int:
    """Bytes from ``"16777216"``, ``"16M"``, ``"16MiB"``, ``"1g"``; ValueError naming ``name`` otherwise."""
    t = text.strip().lower().removesuffix("b")
    digits = t.rstrip("kmgi")
    mult = _SIZE_SUFFIX.get(t[len(digits) :], 1 if t == digits else 0)
    if not digits.isdigit() or mult == 0:
        raise ValueError(f"kvshm: {name}={text!r} is not a size (bytes, or with a K/M/G suffix)")
    return int(digits) * mult
