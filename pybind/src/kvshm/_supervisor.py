"""The producer's core behind ``LocalIndexer``: its ring, its daemon (private or shared) and the supervisor thread
that keeps the two attached. :class:`Core` is everything a LocalIndexer owns; the LocalIndexer facade
(:mod:`kvshm._indexer`) validates the engine's calls and writes the ring under ``Core.lock``.

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

A fork marks every live core unusable in the child (``FORKED``) without taking a lock: the ring, its lock and the
daemon belong to the parent.
"""

from __future__ import annotations

import json
import logging
import os
import select
import threading
import time
import weakref
from typing import Any, Final

from ._batch import BatchBuilder, ZmqPublish
from ._client import Client, ClientError, RemoteError
from ._errors import ClosedError, ForkedProcessError, KvshmError, LauncherError
from ._launcher import PrivateDaemon
from ._ring import RingWriter, default_dir, sweep_stale_rings

__all__ = ["CLOSED", "FORKED", "OPEN", "Core", "error_json"]


log = logging.getLogger("kvshm")

# Core.state values. 0 is the only usable state, so the hot path tests one attribute for truth.
OPEN: Final = 0
CLOSED: Final = 1
FORKED: Final = 2

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
_cores: weakref.WeakSet[Core] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for core in list(_cores):
        core.forked_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Core:
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
        self.state = OPEN
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
        """The truncated ring file: a ring file cut short by another process would make the next publish a SIGBUS
        that kills the engine. Checked under the publishing lock, so no publish is halfway through the mapping."""
        with self.lock:
            if self.state != OPEN or self.ring_truncated or self.ring.check_file():
                return
            self.ring_truncated = True
        self.last_error = (f"the ring file {self.ring.path} was truncated by another process: every publish is "
                           f"dropped from now on (restart the engine to get a new ring)")
        log.error("kvshm: worker %d: %s", self.worker_id, self.last_error)

    def forked_in_child(self) -> None:
        """Called in a forked child (single-threaded): make every method fail and drop inherited sockets."""
        self.state = FORKED
        self.attached = False
        # Close our copies of the connections so the parent's connection EOF still reaches the daemon when the
        # parent dies. The sockets are only fds here: no locks are taken (the parent's threads do not exist).
        for client in [self.attach_conn, *self.idle_queries]:
            if client is not None:
                client.close()

    def close(self) -> None:
        """Tear everything down (idempotent; a no-op outside the owner process)."""
        if os.getpid() != self.owner_pid:
            self.state = FORKED
            return
        with self.lock:
            if self.state == CLOSED:
                return
            self.state = CLOSED
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
            # ATTACH connection (the lease): the daemon takes it only from the producer (a foreign DETACH is refused).
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
        if self.state == FORKED:
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
        return error_json(
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
            return error_json(f"kvshm: kvshmd refused the query: {e.code}: {e.message}")
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
            if self.state == OPEN and len(self.idle_queries) < _IDLE_QUERY_CONNS:
                self.idle_queries.append(client)
                return
        client.close()


def error_json(message: str) -> str:
    return json.dumps({"Error": message}, separators=(",", ":"))
