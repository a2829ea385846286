"""``LocalIndexer``: the engine-facing, drop-in replacement for the ``kv_local_indexer`` extension.

The engine's thread calls ``apply_stored`` / ``apply_removed`` / ``apply_cleared`` once per event (``seq`` is the
event id). Each call validates its arguments (programmer errors raise ``TypeError`` / ``ValueError`` before
anything is written), encodes the event as a FlatBuffer straight into this process's shared-memory ring and
publishes it with one 8-byte store: no system call, no socket I/O, no waiting. kvshmd drains the ring, keeps the
radix tree and the event log, and answers ``get_events_json`` over its Unix socket with Dynamo's
``WorkerKvQueryResponse`` JSON.

Where the daemon comes from:

* default: a private kvshmd started for this process (:class:`kvshm._launcher.PrivateDaemon`), torn down by
  :meth:`LocalIndexer.shutdown`, by interpreter exit (a ``weakref.finalize`` hook, which runs at exit) and, as a
  last resort, by the daemon itself when this process disappears (``--parent-pid``);
* ``socket_path=`` or ``$KVSHM_SOCKET``: a shared kvshmd that somebody else runs. If it is not up yet, the
  indexer starts anyway and attaches as soon as it is.

The ATTACH connection stays open for the producer's lifetime: it is the liveness signal in both directions. A
supervisor thread watches it; when the daemon goes away it reattaches by itself (restarting the private daemon
if that is the one that died), with a capped exponential backoff. Meanwhile publishing goes on into the ring
(events beyond its capacity are dropped and counted: the ring tells the daemon exactly which ids were lost) and
``get_events_json`` returns ``{"Error": "kvshm: ..."}`` instead of raising. A restarted daemon restores its
checkpoint and replays the ring (private daemons), or resumes the ring where the dead one stopped and knows it has
lost the history before that. After any loss the daemon answers, by default, with the best state it has (as Dynamo
would from the events it applied) and reports the loss: ``stats()["incomplete"]`` and ``stats()["lost_ranges"]``,
until a ``Cleared`` re-bases the state (``kvshmd --on-loss=error``: the ``Error`` variant instead).

Inputs are the old extension's (Dynamo 1.6.1 decides what they mean): a token count that is not blocks x
kv_block_size is published as given and hashed by the daemon as Dynamo does (complete windows zipped with the
hashes); numpy integer scalars and arrays are taken wherever ints and id lists are (see :mod:`kvshm._encode`);
``bytes``, ``str`` and mappings are refused as id lists. With ``dp_rank=r`` the indexer is the producer of one
attention-DP rank (kvshmd keeps a stream per ``(worker_id, r)``), and an event of another rank is refused.

Concurrency: publishing is serialized by a lock (uncontended, no system call), so any number of threads may
publish; queries use their own connections (a small pool, so a slow dump does not hold up a quick Events query).
The supervisor thread owns the ATTACH connection and the daemon's restarts. A process forked from the owner gets
:class:`ForkedProcessError` from every method: the ring, its lock and the daemon belong to the parent.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import select
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Final, SupportsIndex

from ._batch import BatchBuilder, ZmqPublish
from ._client import Client, ClientError, RemoteError
from ._encode import IntSequence, prepare_batch
from ._errors import ClosedError, ForkedProcessError, KvshmError, LauncherError
from ._launcher import PrivateDaemon
from ._ring import RingWriter, default_dir, sweep_stale_rings

__all__ = ["LocalIndexer"]


log = logging.getLogger("kvshm")

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

# Core.state values. 0 is the only usable state, so the hot path tests one attribute for truth.
_OPEN: Final = 0
_CLOSED: Final = 1
_FORKED: Final = 2

# Supervisor timing.
_BACKOFF_MIN: Final = 0.05
_BACKOFF_MAX: Final = 2.0
_ATTACH_TIMEOUT: Final = 10.0
# The constructor's attach to a shared daemon: a daemon that accepts but does not answer (hung, SIGSTOPped) costs
# the engine's start-up at most this long; the supervisor then keeps trying in the background.
_FIRST_ATTACH_TIMEOUT: Final = 2.0
_QUERY_TIMEOUT: Final = 120.0  # the global indexer's own recovery deadline (Dynamo fork: 120 s)
_DETACH_TIMEOUT: Final = 5.0
_STATS_TIMEOUT: Final = 2.0
_JOIN_TIMEOUT: Final = 5.0
_HAVE_MEMFD: Final = hasattr(os, "memfd_create")
_RING_CHECK_INTERVAL: Final = 1.0  # how often the supervisor checks that the ring file was not cut short
# ATTACH refusals that retrying cannot fix (configuration errors): raised by the constructor.
_PERMANENT: Final = frozenset({"bad_request", "forbidden", "unsupported_version", "unknown_kind", "too_large"})
_IDLE_QUERY_CONNS: Final = 2  # query connections kept open between queries
_STUCK_ATTACHES: Final = 3  # failed attaches to a live private daemon before it is restarted


# Every live core, so that a fork can mark them all unusable in the child without taking any lock.
_cores: weakref.WeakSet[_Core] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for core in list(_cores):
        core.forked_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Core:
    """Everything a LocalIndexer owns. The supervisor thread and the exit hook reference this object, never the
    LocalIndexer, so an abandoned LocalIndexer is still garbage-collected (and then cleaned up)."""

    def __init__(
        self,
        worker_id: int,
        kv_block_size: int,
        max_buffer_size: int,
        socket_path: str | None,
        ring_dir: str | None,
        ring_bytes: int,
        dp_rank: int | None,
        publish: ZmqPublish | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.publish = publish  # sent in every ATTACH (ports already offset for dp_rank)
        self.batcher = BatchBuilder(kv_block_size, None if publish is None else publish.wire)  # protected by lock
        # Batch counters, protected by lock.
        self.batches = 0  # apply_batch calls that published something
        self.batch_records = 0  # BATCH records written (one per batch)
        self.batch_records_dropped = 0  # BATCH records the ring refused (full, too large): a loss of their seq
        self.batch_events = 0  # events in all batches
        self.batches_fallback = 0  # published event by event (the daemon does not read BATCH records)
        self.fallback_meta_dropped = 0  # events whose metadata a fallback could not carry
        self.fallback_not_indexed = 0  # events a fallback skipped (the daemon's index would not apply them)
        self.dp_rank = dp_rank  # None: this producer publishes for every dp_rank of the worker (scope ALL)
        self.kv_block_size = kv_block_size
        self.max_buffer_size = max_buffer_size
        self.owner_pid = os.getpid()
        # A producer killed without running its exit hooks (SIGKILL, default SIGTERM) leaves its ring file behind.
        sweep_stale_rings(ring_dir or default_dir())
        # First, so that a refused ring (bad size, full /dev/shm, not x86-64) leaves nothing to clean up. Without a
        # ring_dir the ring is a sealed memfd: nobody can truncate it under the engine's mapping (a SIGBUS), and
        # nothing is left behind by a killed engine.
        self.ring = RingWriter.create(
            ring_dir,
            worker_id=worker_id,
            kv_block_size=kv_block_size,
            max_buffer_size=max_buffer_size,
            capacity=ring_bytes,
            mode=0o600,
            memfd=ring_dir is None and _HAVE_MEMFD,
        )
        # Hot-path state. state is written under lock (and by the fork hook in a single-threaded child).
        self.state = _OPEN
        self.lock = threading.Lock()  # serializes ring writes; guards state transitions
        self.published_detached = 0  # protected by lock; publish calls made while no daemon was attached
        self.ring_truncated = False  # protected by lock; see _check_ring
        # Daemon side. attached is written by the supervisor (and shutdown), read racily by anyone.
        self.shared = socket_path is not None
        self.daemon: PrivateDaemon | None = None
        self.socket_path = socket_path or ""
        self.attached = False
        self.attach_conn: Client | None = None  # owned by the supervisor thread
        self.attach_reply: dict[str, Any] = {}
        # The daemon reads BATCH records (its last ATTACH reply said "batches": true); read by apply_batch.
        self.batches_ok = False
        self.attaches = 0
        self.daemon_restarts = 0
        self.last_error: str | None = None
        self.detached_since: float | None = time.time()
        self.query_lock = threading.Lock()
        self.idle_queries: list[Client] = []  # protected by query_lock; connections for queries, reused
        self.closing = threading.Event()
        self.supervisor: threading.Thread | None = None
        # The wake pipe and the attach connection are the supervisor's while it runs. close() closes them itself
        # only once the supervisor has exited; if it is still inside an attach after the join timeout they are
        # handed over (handoff) and the supervisor closes them on its way out, so no descriptor it may still use is
        # closed under it (and reused by the application). Both flags are protected by fd_lock.
        self.fd_lock = threading.Lock()
        self.supervisor_done = False
        self.handoff = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        _cores.add(self)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start (private) or find (shared) the daemon, attach once synchronously, start the supervisor."""
        if not self.shared:
            self.daemon = PrivateDaemon()
            self.socket_path = self.daemon.socket_path
            self.daemon.start()  # raises LauncherError with the daemon's output
            try:
                self._attach()
            except ClientError as e:  # a private daemon that refuses us will not change its mind
                raise KvshmError(f"kvshm: the private kvshmd refused the ring {self.ring.path}: {e}") from e
        else:
            try:
                self._attach(_FIRST_ATTACH_TIMEOUT)
            except RemoteError as e:
                if e.code in _PERMANENT:
                    raise KvshmError(
                        f"kvshm: kvshmd at {self.socket_path} refused the ring {self.ring.path}: {e}") from e
                self.last_error = str(e)
                log.warning("kvshm: kvshmd at %s refused to attach yet (%s); will keep trying", self.socket_path, e)
            except (ClientError, OSError) as e:
                self.last_error = str(e)
                log.warning("kvshm: shared kvshmd at %s not reachable yet (%s); will keep trying", self.socket_path, e)
        self.supervisor = threading.Thread(
            target=self._supervise, name=f"kvshm-supervisor-{self.worker_id}", daemon=True
        )
        self.supervisor.start()

    def _attach(self, timeout: float | None = None) -> None:
        """Connect and ATTACH (within ``timeout``, default _ATTACH_TIMEOUT); on success the connection becomes the
        producer's lease (unless shutdown began meanwhile: then it is closed, and the supervisor exits)."""
        client = Client(self.socket_path, connect_timeout=2.0, timeout=_ATTACH_TIMEOUT if timeout is None else timeout)
        try:
            reply = client.attach(
                self.ring.path,
                self.worker_id,
                self.kv_block_size,
                self.max_buffer_size,
                dp_rank=self.dp_rank,
                publish=None if self.publish is None else self.publish.to_json(),
            )
        except BaseException:
            client.close()
            raise
        if self.closing.is_set():
            client.close()
            return
        self.attach_conn = client
        self.attach_reply = reply
        self.batches_ok = reply.get("batches") is True
        self.attaches += 1
        self.last_error = None
        self.detached_since = None
        self.attached = True

    def _detach_local(self, reason: str) -> None:
        self.attached = False
        if self.detached_since is None:
            self.detached_since = time.time()
        self.last_error = reason
        conn, self.attach_conn = self.attach_conn, None
        if conn is not None:
            conn.close()

    def _sleep(self, seconds: float) -> None:
        """Wait up to ``seconds``, returning early when woken (shutdown)."""
        self._wait_readable(-1, seconds)

    def _wait_readable(self, fd: int, timeout: float | None) -> bool:
        """Poll ``fd`` (if >= 0) and the wake pipe; returns True if ``fd`` is readable or hung up."""
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if fd >= 0:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        events = poller.poll(None if timeout is None else int(timeout * 1000))
        hit = False
        for efd, _ in events:
            if efd == self._wake_r:
                try:
                    os.read(self._wake_r, 512)
                except BlockingIOError:
                    pass
            elif efd == fd:
                hit = True
        return hit

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _supervise(self) -> None:
        """Owns the attach connection: watches it for EOF and reattaches (restarting a private daemon)."""
        try:
            self._supervise_loop()
        finally:
            with self.fd_lock:
                self.supervisor_done = True
                if self.handoff:
                    self._close_supervisor_fds()

    def _close_supervisor_fds(self) -> None:
        """Close the attach connection and the wake pipe (with fd_lock held, once the supervisor is done)."""
        conn, self.attach_conn = self.attach_conn, None
        if conn is not None:
            conn.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _supervise_loop(self) -> None:
        backoff = _BACKOFF_MIN
        failures = 0
        while not self.closing.is_set():
            self._check_ring()
            conn = self.attach_conn
            if conn is not None:
                if not self._wait_readable(conn.fileno(), _RING_CHECK_INTERVAL) or self.closing.is_set():
                    continue
                # The daemon never writes on this connection after ATTACH: readable means EOF (it died or
                # dropped us) or a protocol violation. Either way the lease is gone.
                self._detach_local("kvshmd closed the producer connection (daemon exited or restarted)")
                log.warning("kvshm: worker %d lost kvshmd at %s; reattaching", self.worker_id, self.socket_path)
                backoff = _BACKOFF_MIN
                failures = 0
                continue
            try:
                if self.daemon is not None:
                    if not self.daemon.alive():
                        code = self.daemon.returncode()
                        self.last_error = f"private kvshmd exited (status {code}); restarting it"
                        self.daemon_restarts += 1
                        self.daemon.start()
                    elif failures >= _STUCK_ATTACHES:
                        self.daemon_restarts += 1
                        self.daemon.start()  # alive but not accepting us: replace it
                        failures = 0
                self._attach()
                log.warning("kvshm: worker %d reattached to kvshmd at %s", self.worker_id, self.socket_path)
                backoff = _BACKOFF_MIN
                failures = 0
            except (ClientError, LauncherError, OSError) as e:
                failures += 1
                self.last_error = str(e)
                self._sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    def _check_ring(self) -> None:
        """Issue 10, defect 5: a ring file truncated by another process would make the next publish a SIGBUS that
        kills the engine. Checked under the publishing lock, so no publish is halfway through the mapping."""
        with self.lock:
            if self.state != _OPEN or self.ring_truncated or self.ring.check_file():
                return
            self.ring_truncated = True
        self.last_error = (f"the ring file {self.ring.path} was truncated by another process: every publish is "
                           f"dropped from now on (restart the engine to get a new ring)")
        log.error("kvshm: worker %d: %s", self.worker_id, self.last_error)

    def forked_in_child(self) -> None:
        """Called in a forked child (single-threaded): make every method fail and drop inherited sockets."""
        self.state = _FORKED
        self.attached = False
        # Close our copies of the connections so the parent's connection EOF still reaches the daemon when the
        # parent dies. The sockets are only fds here: no locks are taken (the parent's threads do not exist).
        for client in [self.attach_conn, *self.idle_queries]:
            if client is not None:
                client.close()

    def close(self) -> None:
        """Tear everything down (idempotent; a no-op outside the owner process)."""
        if os.getpid() != self.owner_pid:
            self.state = _FORKED
            return
        with self.lock:
            if self.state == _CLOSED:
                return
            self.state = _CLOSED
        self.closing.set()
        self.wake()
        sup = self.supervisor
        if sup is not None and sup is not threading.current_thread():
            sup.join(_JOIN_TIMEOUT)
        try:
            self.ring.close()  # state CLOSED in the header: a clean goodbye
        except Exception as e:  # noqa: BLE001 - teardown must go on
            log.warning("kvshm: closing the ring %s: %s", self.ring.path, e)
        if self.shared and self.attached:
            # Let the shared daemon apply everything we published before it forgets the producer. DETACH goes on the
            # ATTACH connection (the lease): the daemon takes it only from the producer (issue 10, defect 2).
            with self.fd_lock:
                lease = self.attach_conn if self.supervisor_done or self.supervisor is None else None
            if lease is not None:
                try:
                    lease.detach(self.worker_id, dp_rank=self.dp_rank, timeout=_DETACH_TIMEOUT)
                except ClientError as e:
                    log.warning("kvshm: detaching worker %d from kvshmd: %s", self.worker_id, e)
        self.attached = False
        with self.query_lock:
            idle, self.idle_queries = self.idle_queries, []
        for client in idle:
            client.close()
        with self.fd_lock:
            if self.supervisor_done or self.supervisor is None:
                self._close_supervisor_fds()
            else:  # still inside an attach (at most _ATTACH_TIMEOUT): it closes them when it returns
                self.handoff = True
        if self.daemon is not None:
            self.daemon.stop()
        try:
            self.ring.unlink()
        except OSError as e:
            log.warning("kvshm: removing the ring %s: %s", self.ring.path, e)
        _cores.discard(self)

    def raise_unusable(self) -> None:
        if self.state == _FORKED:
            raise ForkedProcessError(
                f"kvshm: this LocalIndexer belongs to process {self.owner_pid}; a forked child (pid {os.getpid()}) "
                "cannot use it: create a new LocalIndexer in the child"
            )
        raise ClosedError("kvshm: LocalIndexer is shut down")

    # -- queries ------------------------------------------------------------------------------------------
    def unavailable(self, why: str) -> str:
        since = ""
        if self.detached_since is not None:
            since = f" for {max(0.0, time.time() - self.detached_since):.1f} s"
        return _error_json(
            f"kvshm: kvshmd is unavailable{since} ({why}); events are kept in the ring and the client is "
            "reattaching: retry later"
        )

    def events_json(self, start: int | None, end: int | None) -> str:
        if not self.attached:
            return self.unavailable(self.last_error or "not attached")
        client = self.take_query_client()
        try:
            text = client.events_text(self.worker_id, start, end, dp_rank=self.dp_rank)
        except RemoteError as e:
            self.give_back_query_client(client)
            return _error_json(f"kvshm: kvshmd refused the query: {e.code}: {e.message}")
        except ClientError as e:
            client.close()
            self.wake()
            return self.unavailable(str(e))
        self.give_back_query_client(client)
        return text

    def daemon_stream(self) -> dict[str, Any] | None:
        """This producer's stream in the daemon's STATS (matched by ring path), or None when the daemon is away,
        does not answer within a short deadline, or no longer lists the ring."""
        if not self.attached:
            return None
        client = self.take_query_client()
        try:
            reply = client.stats(self.worker_id, timeout=_STATS_TIMEOUT)
        except RemoteError:
            self.give_back_query_client(client)
            return None
        except ClientError:
            client.close()
            return None
        self.give_back_query_client(client)
        streams = reply.get("streams")
        for stream in streams if isinstance(streams, list) else []:
            if isinstance(stream, dict) and stream.get("ring_path") == self.ring.path:
                return stream
        return None

    def take_query_client(self) -> Client:
        """An idle query connection, or a new one: concurrent queries (a slow dump, a quick Events) do not wait
        for each other."""
        with self.query_lock:
            if self.idle_queries:
                return self.idle_queries.pop()
        return Client(self.socket_path, connect_timeout=2.0, timeout=_QUERY_TIMEOUT)

    def give_back_query_client(self, client: Client) -> None:
        with self.query_lock:
            if self.state == _OPEN and len(self.idle_queries) < _IDLE_QUERY_CONNS:
                self.idle_queries.append(client)
                return
        client.close()


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
        core = _Core(
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

    def stats(self, *, daemon: bool = True) -> dict[str, Any]:
        """Counters and state: the local ones (publishes, drops, attachment, ring fill) and what the daemon knows
        of this producer's stream (one STATS round trip on the Unix socket, bounded by a 2 s deadline; with
        ``daemon=False`` none: local fields only, no I/O, for tight loops or a daemon that may be stopped).

        The daemon's fields are None when it is away or not asked: ``incomplete`` (True while answers miss events
        kvshm lost: ring full, corrupt record, unknown history; until a Cleared), ``lost_ranges`` (``[{"first",
        "last", "reason"}]``, newest last; an unknown history is named in ``daemon_stream["taint_reason"]``),
        ``token_mismatches`` (Stored events whose token count was not blocks x block_size), ``daemon_stream`` (the
        daemon's whole STATS entry for this stream). ``dp_rank`` is the indexer's rank (None: every rank). Never
        raises because the daemon is unreachable.
        """
        core = self._core
        if core.state == _FORKED:
            core.raise_unusable()
        with core.lock:
            detached = core.published_detached
            ring = dict(self._ring.stats()) if core.state == _OPEN else {}
            batch = {
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
        stream = core.daemon_stream() if daemon and core.state == _OPEN else None
        return {
            "worker_id": core.worker_id,
            "dp_rank": core.dp_rank,
            "kv_block_size": core.kv_block_size,
            "max_buffer_size": core.max_buffer_size,
            "mode": "shared" if core.shared else "private",
            "socket_path": core.socket_path,
            "ring_path": core.ring.path,
            "closed": core.state == _CLOSED,
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
            # Issue 12: the daemon reads BATCH records / publishes this stream on ZMQ (from the ATTACH reply), the
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
        if core.state == _FORKED:
            core.raise_unusable()
        self._finalizer()

    def __enter__(self) -> LocalIndexer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        core = self._core
        state = {_OPEN: "open", _CLOSED: "closed", _FORKED: "forked"}[core.state]
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


def _error_json(message: str) -> str:
    return json.dumps({"Error": message}, separators=(",", ":"))


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
