"""The producer side of a kvshm ring: events go straight into shared memory, no lock, no system call (but the
doorbell's).

A ring is an mmap'd regular file (layout version 1, shm/FORMAT.md; the numbers in :mod:`kvshm._layout`): a 4096-byte
header page, then a power-of-two data area of 8-byte-aligned records ``[u32 length][u32 type][payload]``. The
producer writes a record's payload, then its header, with plain stores, then publishes it with ONE store of the tail
word, a store-release: the Go reader (kvshmd) trusts everything before the tail. The ordered accesses are
:mod:`kvshm._words`'s: the C extension on every CPU (STLR on aarch64, XCHG on x86-64), or, only on x86-64 where the
extension is missing, a plain memoryview store (a release under x86-TSO). Without either, :meth:`RingWriter.create`
refuses (:class:`RingPlatformError`).

Usage contract (stable; kvshm's LocalIndexer is the caller)::

    w = RingWriter.create(dir, worker_id, kv_block_size, max_buffer_size, capacity, mode=0o600)
    w.path, w.epoch                       # ring file and producer incarnation, sent to kvshmd in ATTACH
    w.publish_stored(seq, token_ids, block_hashes, parent_hash, dp_rank, lora_name, is_eagle) -> bool
    w.publish_removed(seq, block_hashes, dp_rank) -> bool
    w.publish_cleared(seq, dp_rank) -> bool
    w.publish_batch(prepared) -> bool     # a BATCH record (kvshm._encode.prepare_batch), for a daemon that reads them
    w.stats() -> dict                     # counters, for the LocalIndexer's statistics
    w.close()                             # state CLOSED, unmap, release the lock; the file stays for the reader
    w.unlink()                            # remove the file (after the daemon has drained/detached)

* ``create``: ``dir`` None means ``$KVSHM_RING_DIR``, else /dev/shm, else the temp dir. The file is created with
  ``O_EXCL`` and exactly ``mode``, locked with ``flock(LOCK_EX|LOCK_NB)`` for the writer's lifetime (a second producer
  on the same file is refused with :class:`RingLockedError`), preallocated with ``posix_fallocate`` (a full /dev/shm
  fails here with :class:`RingSpaceError` instead of a SIGBUS later), and its header is complete before the state
  word becomes READY (a release).
* ``publish_*`` never block: they return True when the event is published, False when it was dropped because the
  ring is full or the record is larger than ``max_record``. A drop is counted in the header (dropped_events,
  dropped_bytes = payload bytes, and the pending loss seq range) where the daemon sees it, and the next event that fits
  is preceded by a LOSS record ``{first_seq, last_seq, count}``, published with it. Arguments are validated and
  converted before anything is written (ValueError/TypeError, see :mod:`kvshm._encode`); a failed call changes
  nothing.
* A forked child cannot publish into its parent's ring: :class:`RingForkedError` (an at-fork hook marks every live
  writer in the child, and ``close``/``stats`` also compare ``os.getpid()`` with the creating pid). ``close`` in a
  child only drops the child's mapping.
* Concurrency: a RingWriter is used by one thread at a time (the caller serializes; CPython's GIL makes no promise
  across the several stores of one publish).

Hot path of a publish: the encoder converts the lists (``array('I')``/``array('Q')``), one ``pack_into`` writes the
record header and every non-vector byte, slice copies write the vectors, one call of the extension stores the tail
and loads ``consumer_parked`` (the fallback: one memoryview store and one load). The head word (the consumer's) is
read only when the cached head says the ring is full, or when a lazy consumer's doorbell level may be reached.

Doorbell (FORMAT.md, "Doorbell"): a consumer with nothing to read for a while stores ``consumer_parked = 1`` (u32 at
0x208), re-checks the tail and sleeps in ``FUTEX_WAIT`` on the low 32 bits of the tail word, with a timeout. The
writer's tail store and its load of ``consumer_parked`` are separated by a full fence (the extension), so this Dekker
pair (store tail, load parked; against the consumer's store parked, load tail, fenced by Go's seq-cst atomics) never
misses: when the flag is set the writer calls ``FUTEX_WAKE`` (shared, not FUTEX_PRIVATE: the consumer is another
process). A value above 1 is a doorbell level: ring only when the bytes published past the consumer's head reach it.
The x86-64 fallback has no fence, so its wakeup can be missed; the consumer always parks with a timeout (kvshmd:
10 ms for a stream it publishes, 1 s otherwise), which bounds that delay: no record is ever lost, only reached late.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import struct
import tempfile
import time
import weakref
from typing import Any, Final, SupportsIndex

from kvshm._encode import Prepared, check_seq_dp, prepare_cleared, prepare_removed, prepare_stored
from kvshm._errors import KvshmError
from kvshm._layout import (
    HEADER,
    HEADER_SIZE,
    LOSS_RECORD,
    MAGIC,
    MAX_CAPACITY,
    MIN_CAPACITY,
    OFF_DROPPED_BYTES,
    OFF_DROPPED_EVENTS,
    OFF_HEAD,
    OFF_HEARTBEAT,
    OFF_LOSS_FIRST,
    OFF_LOSS_LAST,
    OFF_LOSS_PENDING,
    OFF_PARKED,
    OFF_STATE,
    OFF_TAIL,
    RECORD_HEADER,
    STATE_CLOSED,
    STATE_READY,
    TYPE_LOSS,
    TYPE_PADDING,
    VERSION,
)
from kvshm._proc import start_time
from kvshm._sweep import ring_file_name, sweep_stale_rings
from kvshm._words import PyWords, Words, make_words, unsupported

log = logging.getLogger("kvshm")

__all__ = [
    "RingError",
    "RingClosedError",
    "RingForkedError",
    "RingLockedError",
    "RingPlatformError",
    "RingSpaceError",
    "RingWriter",
    "default_dir",
    "ring_file_name",
    "sweep_stale_rings",
]

_RECORD_HEADER: Final = struct.Struct("<II")
_LOSS: Final = struct.Struct("<IIQQQ")

_U32: Final = (1 << 32) - 1
_U64: Final = (1 << 64) - 1


class RingError(KvshmError):
    """Base of the errors RingWriter raises (a :class:`kvshm.KvshmError`)."""


class RingPlatformError(RingError):
    """No safe publication here: not a 64-bit little-endian CPython, or the C extension kvshm._ringsync is missing
    on a CPU other than x86-64 (where a plain 8-byte store from Python is not a release)."""


class RingLockedError(RingError):
    """Another producer holds the ring file's lock."""


class RingSpaceError(RingError):
    """The file system cannot hold the whole ring (e.g. /dev/shm is full)."""


class RingForkedError(RingError):
    """The writer was created by another process (this is a forked child)."""


class RingClosedError(RingError):
    """The writer has been closed."""


_PROC_FD: Final = "/proc/"


def _create_memfd(name: str, mode: int) -> tuple[int, str]:
    """A new memfd that allows sealing (sealed by create once its size is final), mode ``mode``, and the path the
    daemon opens it by. Raises OSError where the kernel has no memfd_create (create then needs a ``dir``)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, mode)  # memfds are created 0777
    except BaseException:
        os.close(fd)
        raise
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


def default_dir() -> str:
    """``$KVSHM_RING_DIR`` if set, else /dev/shm if it is a directory, else the temp directory."""
    d = os.environ.get("KVSHM_RING_DIR")
    if d:
        return d
    if os.path.isdir("/dev/shm"):
        return "/dev/shm"
    return tempfile.gettempdir()


def check_platform(native: bool = True) -> None:
    """Raises RingPlatformError unless this interpreter can publish into a ring (:func:`kvshm._words.unsupported`):
    64-bit little-endian CPython, with the C extension, or without it (``native`` False, or not installed) on
    x86-64."""
    why = unsupported(native)
    if why is not None:
        raise RingPlatformError(why)


# Live writers, marked in a forked child by the at-fork hook (cheaper than os.getpid(), a syscall, per publish).
_WRITERS: weakref.WeakSet[RingWriter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for w in list(_WRITERS):
        w._forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


class RingWriter:
    """The producer of one ring file. Never blocks; one thread at a time. See the module docstring."""

    # Hot fields first; all are owned by the producer thread.
    __slots__ = (
        "_mm", "_q", "_cap", "_mask", "_max_record", "_tail", "_head_cache", "_forked", "_closed",
        "_loss_pending", "_loss_first", "_loss_last", "_loss_count", "_dropped_events", "_dropped_bytes",
        "_too_large", "_published", "_truncated", "_fd", "_pid", "_words", "_sync", "path", "epoch", "worker_id",
        "kv_block_size", "max_buffer_size", "__weakref__",
    )
    _mm: mmap.mmap
    _q: memoryview  # the whole mapping as u64 words: the tail store, head load and counters
    _cap: int
    _mask: int
    _max_record: int
    _tail: int  # last published tail
    _head_cache: int  # last head loaded; re-read only when it says the ring is full
    _forked: bool  # set in a forked child by the at-fork hook
    _closed: bool
    _loss_pending: bool
    _loss_first: int
    _loss_last: int
    _loss_count: int  # events dropped since the last LOSS record
    _dropped_events: int
    _dropped_bytes: int
    _too_large: int
    _published: int
    _truncated: bool  # the file was cut short under us: never touch the mapping again (see check_file)
    _fd: int  # holds the flock
    _pid: int  # creating process
    _words: Words  # the ordered accesses (kvshm._words); exports mm, released before close
    _sync: Any  # _words.publish when native; None: the x86-64 fallback's inline store and load
    path: str
    epoch: int
    worker_id: int
    kv_block_size: int
    max_buffer_size: int

    def __init__(self) -> None:  # use RingWriter.create
        raise TypeError("use RingWriter.create(...)")

    @classmethod
    def create(
        cls,
        dir: str | None,
        worker_id: int,
        kv_block_size: int,
        max_buffer_size: int,
        capacity: int,
        mode: int = 0o600,
        *,
        max_record: int | None = None,
        name: str | None = None,
        memfd: bool = False,
        native: bool = True,
    ) -> RingWriter:
        """Creates, preallocates, locks and maps a new ring file and returns its writer.

        With ``memfd`` the ring is an anonymous memory file sealed against shrinking and growing
        (``memfd_create`` + ``F_SEAL_SHRINK|F_SEAL_GROW``): no process can truncate it under the mapping (which
        would make the next publish a SIGBUS), it vanishes with its last user, and the daemon opens it as
        ``/proc/<pid>/fd/<n>`` (``path``); ``dir`` and ``name`` are not used.

        ``capacity`` is the data area size (a power of two in [64 KiB, 4 GiB]); ``max_record`` (bytes including the
        8-byte record header, a multiple of 8 in [32, capacity/8]) defaults to capacity/8; ``name`` defaults to
        ``kvshm-w<worker_id>-<pid>-<epoch>.ring``. ``native`` False uses the pure-Python publication even when the
        C extension is installed (x86-64 only: for tests and for the benchmark's same-run baseline). Raises
        ValueError for invalid arguments, RingPlatformError where there is no safe publication (check_platform),
        RingLockedError when a live producer holds an existing file of that name, FileExistsError when a
        stale file has that name, RingSpaceError when the file system is full, OSError otherwise.
        """
        check_platform(native)
        for what, v, hi in (("worker_id", worker_id, _U64), ("kv_block_size", kv_block_size, _U32),
                            ("max_buffer_size", max_buffer_size, _U32), ("capacity", capacity, MAX_CAPACITY)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"kvshm: {what} must be an int, not {type(v).__name__}")
            if not 0 <= v <= hi:
                raise ValueError(f"kvshm: {what} {v} out of range [0, {hi}]")
        if kv_block_size == 0:
            raise ValueError("kvshm: kv_block_size must be positive")
        if capacity < MIN_CAPACITY or capacity & (capacity - 1):
            raise ValueError(f"kvshm: capacity {capacity} is not a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}]")
        if max_record is None:
            max_record = capacity // 8
        if not LOSS_RECORD <= max_record <= capacity // 8 or max_record % 8:
            raise ValueError(f"kvshm: max_record {max_record} is not a multiple of 8 in [{LOSS_RECORD}, capacity/8]")
        if mode & ~0o777:
            raise ValueError(f"kvshm: mode {mode:#o} has bits other than permissions")
        epoch = time.time_ns() or 1
        pid = os.getpid()
        if dir is None:
            dir = default_dir()
        size = HEADER_SIZE + capacity
        if memfd:
            fd, path = _create_memfd(ring_file_name(worker_id, pid, epoch), mode)
        else:
            path = os.path.join(dir, name or ring_file_name(worker_id, pid, epoch))
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            except FileExistsError:
                _raise_existing(path)
                raise
        try:
            os.fchmod(fd, mode)  # exactly mode, whatever the umask
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RingLockedError(f"kvshm: ring {path} is locked by another producer") from None
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    where = "shared memory" if memfd else dir
                    raise RingSpaceError(f"kvshm: no space for a {size}-byte ring in {where}: {e}") from None
                raise
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if memfd:  # after the preallocation: the size is final
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        except BaseException:
            os.close(fd)
            if not memfd:
                os.unlink(path)
            raise
        # The file is fresh (fallocate zero-fills): tail, head, the counters and the state (INIT) are 0.
        HEADER.pack_into(mm, 0, MAGIC, VERSION, HEADER_SIZE, capacity, max_record, 0, pid, 0, start_time(), epoch,
                         worker_id, kv_block_size, max_buffer_size)
        w = object.__new__(cls)
        w._mm = mm
        w._q = memoryview(mm).cast("Q")
        w._cap = capacity
        w._mask = capacity - 1
        w._max_record = max_record
        w._tail = 0
        w._head_cache = 0
        w._truncated = False
        w._forked = False
        w._closed = False
        w._loss_pending = False
        w._loss_first = w._loss_last = w._loss_count = 0
        w._dropped_events = w._dropped_bytes = w._too_large = w._published = 0
        w._fd = fd
        w._pid = pid
        w._words = make_words(mm, OFF_TAIL, OFF_PARKED, native)
        w._sync = None if isinstance(w._words, PyWords) else w._words.publish
        w.path = path
        w.epoch = epoch
        w.worker_id = worker_id
        w.kv_block_size = kv_block_size
        w.max_buffer_size = max_buffer_size
        w._words.store_release32(OFF_STATE, STATE_READY)  # release: after every header byte above
        _WRITERS.add(w)
        return w

    # ----------------------------------------------------------------------------------------------------------
    # Publishing

    def publish_stored(
        self,
        seq: SupportsIndex,
        token_ids: Any,
        block_hashes: Any,
        parent_hash: SupportsIndex | None,
        dp_rank: SupportsIndex,
        lora_name: str | None,
        is_eagle: bool,
    ) -> bool:
        """Publishes a Stored event (token ids and hashes as lists or any iterables of ints). Never blocks;
        returns False when the event was dropped (ring full or record too large; counted)."""
        if self._forked or self._closed:
            self._refuse()
        return self._publish(prepare_stored(seq, token_ids, block_hashes, parent_hash, dp_rank, lora_name, is_eagle))

    def publish_removed(self, seq: SupportsIndex, block_hashes: Any, dp_rank: SupportsIndex) -> bool:
        """Publishes a Removed event. Never blocks; returns False when it was dropped (counted)."""
        if self._forked or self._closed:
            self._refuse()
        return self._publish(prepare_removed(seq, block_hashes, dp_rank))

    def publish_cleared(self, seq: SupportsIndex, dp_rank: SupportsIndex) -> bool:
        """Publishes a Cleared event. Never blocks; returns False when it was dropped (counted)."""
        if self._forked or self._closed:
            self._refuse()
        return self._publish(prepare_cleared(seq, dp_rank))

    def publish_prepared(self, p: Prepared) -> bool:
        """Publishes an event prepared by one of :mod:`kvshm._encode`'s ``prepare_*`` functions. Never blocks;
        returns False when it was dropped (counted)."""
        if self._forked or self._closed:
            self._refuse()
        return self._publish(p)

    def publish_batch(self, p: Prepared) -> bool:
        """Publishes a BATCH record prepared by :func:`kvshm._encode.prepare_batch` (one record: the daemon never
        sees half a batch). Never blocks; returns False when it was dropped (ring full or larger than
        ``max_record``), counted as one dropped event with the batch's seq."""
        if self._forked or self._closed:
            self._refuse()
        return self._publish(p)

    def _publish(self, p: Prepared) -> bool:
        """Writes the prepared event at the tail and publishes it with one tail store, or counts the drop."""
        if self._loss_pending:
            return self._publish_after_loss(p)
        size = p[0]
        rec = (size + 15) & ~7  # align8(8 + size)
        if rec > self._max_record:
            self._drop(p, True)
            return False
        tail = self._tail
        cap = self._cap
        idx = tail & self._mask
        pad = cap - idx if rec > cap - idx else 0
        end = tail + pad + rec
        if end - self._head_cache > cap and not self._refresh_head(end):
            self._drop(p, False)
            return False
        mm = self._mm
        if pad:
            _RECORD_HEADER.pack_into(mm, HEADER_SIZE + idx, pad, TYPE_PADDING)
            idx = 0
        p[1](mm, HEADER_SIZE + idx, p)  # payload and record header
        sync = self._sync
        if sync is not None:
            parked = sync(end)  # the tail store (release, then a full fence) and the load of consumer_parked
        else:  # the x86-64 fallback (kvshm._words): release under x86-TSO, no fence
            q = self._q
            q[16] = end  # OFF_TAIL / 8
            parked = q[65]  # OFF_PARKED / 8: the flag and 4 zero bytes
        if parked:
            self._ring_doorbell(end, parked)
        self._tail = end
        self._published += 1
        return True

    def _ring_doorbell(self, end: int, level: int) -> None:
        """FUTEX_WAKE on the tail word when the parked consumer's doorbell level is reached (FORMAT.md, "Doorbell"):
        1, every publication; more, the bytes published up to ``end`` past its head reach ``level`` (a lazy
        consumer). The cached head is older than the header's, so a backlog below the level by it is below for sure;
        otherwise the head is loaded once (not cached: the cache belongs to the free-space check). Errors are
        ignored (the consumer's park timeout is the fallback)."""
        if level != 1 and (end - self._head_cache < level or end - self._words.load_acquire(OFF_HEAD) < level):
            return
        self._words.wake()

    def _refresh_head(self, end: int) -> bool:
        """Loads the consumer's head (acquire) and says whether ``end`` fits. A head ahead of the tail by at
        most a ring re-bases the writer there (shm/FORMAT.md, "Failure outcomes"); any other head no correct
        consumer stores (further ahead, misaligned, moving back) is treated as a full ring, never trusted."""
        head = self._words.load_acquire(OFF_HEAD)
        if head > self._tail and not head & 7 and head - self._tail <= self._cap:
            # The consumer skipped to a corrupt tail word that lay ahead of ours: it abandoned every position
            # before ``head``, so write from there on. This event is dropped (counted, reported by the next LOSS
            # record), which keeps the repair to one rule (as the Go Writer does).
            self._tail = self._head_cache = head
            return False
        if head > self._tail or head & 7 or head < self._head_cache:
            return False
        self._head_cache = head
        return end - head <= self._cap

    def _reserve(self, tail: int, length: int) -> tuple[int, int] | None:
        """Room for a record of ``length`` bytes staged at ``tail``: (index, end position) with a padding record
        written when the record would cross the end, or None when it does not fit."""
        rec = (length + 7) & ~7
        idx = tail & self._mask
        pad = self._cap - idx if rec > self._cap - idx else 0
        end = tail + pad + rec
        if end - self._head_cache > self._cap and not self._refresh_head(end):
            return None
        if pad:
            _RECORD_HEADER.pack_into(self._mm, HEADER_SIZE + idx, pad, TYPE_PADDING)
            idx = 0
        return idx, end

    def _publish_after_loss(self, p: Prepared) -> bool:
        """Stages a LOSS record for the pending drops, then the event, and publishes both with one tail store;
        when the event does not fit, neither is published (the LOSS record is retried with the next event)."""
        size = p[0]
        if size + RECORD_HEADER > self._max_record:
            self._drop(p, True)
            return False
        r = self._reserve(self._tail, LOSS_RECORD)
        if r is None:
            self._drop(p, False)
            return False
        idx, end = r
        r = self._reserve(end, RECORD_HEADER + size)
        if r is None:
            self._drop(p, False)
            return False
        _LOSS.pack_into(self._mm, HEADER_SIZE + idx, LOSS_RECORD, TYPE_LOSS, self._loss_first, self._loss_last,
                        self._loss_count)
        idx, end = r
        p[1](self._mm, HEADER_SIZE + idx, p)
        parked = self._words.publish(end)  # publishes the LOSS record and the event
        if parked:
            self._ring_doorbell(end, parked)
        self._tail = end
        self._published += 1
        # After the tail store: the LOSS record in the stream is authoritative, the header fields are gauges.
        self._loss_pending = False
        self._loss_count = 0
        self._words.store_release(OFF_LOSS_PENDING, 0)
        return True

    def _drop(self, p: Prepared, too_large: bool) -> None:
        """Counts one dropped event (its payload bytes) and extends the pending loss range. The event's seq and
        dp_rank are validated first (the writer's pack would have checked them), so a bad call changes nothing."""
        check_seq_dp(p[3], p[4])
        seq = p[3]
        size = p[0]
        q = self._q
        self._dropped_events += 1
        self._dropped_bytes += size
        if self._truncated:  # counted here only: the header may lie past the end of the file
            return
        self._loss_count += 1
        if too_large:
            self._too_large += 1
        if not self._loss_pending:
            self._loss_first = seq
            q[OFF_LOSS_FIRST >> 3] = seq
        self._loss_last = seq
        q[OFF_LOSS_LAST >> 3] = seq
        q[OFF_DROPPED_EVENTS >> 3] = self._dropped_events
        q[OFF_DROPPED_BYTES >> 3] = self._dropped_bytes
        if not self._loss_pending:
            self._loss_pending = True
            self._words.store_release(OFF_LOSS_PENDING, 1)  # after loss_first_seq and loss_last_seq

    def _refuse(self) -> None:
        if self._closed:
            raise RingClosedError(f"kvshm: ring writer for {self.path} is closed")
        raise RingForkedError(
            f"kvshm: ring {self.path} belongs to process {self._pid}; this is a forked child (pid {os.getpid()}), "
            "which must not write into its parent's ring: create a new LocalIndexer in the child"
        )

    # ----------------------------------------------------------------------------------------------------------
    # Life cycle and statistics

    def _check_owner(self) -> None:
        if self._forked or os.getpid() != self._pid:
            self._forked = True
            self._refuse()

    def check_file(self) -> bool:
        """Returns True while the ring file has its full size. A file cut short (another process truncated it)
        makes any store into the mapping a SIGBUS that kills the engine, so from the first failed check on the
        writer never touches the mapping again: every publish is dropped (counted in stats() only), stats() and
        close() leave the mapping alone. Call it periodically from a thread holding the writer's lock (the
        LocalIndexer's supervisor does, every _RING_CHECK_INTERVAL): a truncation between two checks can still
        fault a publish. Costs one fstat."""
        if self._truncated or self._closed:
            return not self._truncated
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            return True  # cannot tell; the descriptor is ours, so this does not happen
        if size >= HEADER_SIZE + self._cap:
            return True
        self._truncated = True
        self._max_record = -1  # every publish now takes the drop path: no extra check on the hot path
        return False

    def stats(self) -> dict[str, Any]:
        """A snapshot of the ring: positions, usage and drop counters (head and heartbeat are the consumer's)."""
        if self._closed:
            self._refuse()
        self._check_owner()
        self.check_file()  # an fstat: reading the head of a truncated file would be a SIGBUS
        q = self._q
        head = 0 if self._truncated else q[OFF_HEAD >> 3]
        return {
            "path": self.path,
            "epoch": self.epoch,
            "capacity": self._cap,
            "max_record": self._max_record,
            "head": head,
            "tail": self._tail,
            "used": self._tail - head if head <= self._tail else 0,
            "published_events": self._published,
            "dropped_events": self._dropped_events,
            "dropped_bytes": self._dropped_bytes,
            "dropped_too_large": self._too_large,
            "loss_pending": self._loss_pending,
            "loss_first_seq": self._loss_first if self._loss_pending else None,
            "loss_last_seq": self._loss_last if self._loss_pending else None,
            "consumer_heartbeat_ns": None if self._truncated else q[OFF_HEARTBEAT >> 3],
            "truncated": self._truncated,
        }

    def close(self) -> None:
        """Stores state CLOSED (after the last tail store), unmaps and releases the lock. The file stays for the
        reader; see unlink. Idempotent. In a forked child it only drops the child's copy of the mapping."""
        if self._closed:
            return
        self._closed = True
        _WRITERS.discard(self)
        owner = not self._forked and os.getpid() == self._pid
        if owner and not self._truncated:
            self._words.store_release32(OFF_STATE, STATE_CLOSED)  # after the last tail store
        self._q.release()  # mmap.close() refuses while a memoryview is exported
        self._words.release()  # so does the extension's buffer export
        self._mm.close()
        os.close(self._fd)  # releases the flock (in a child: only the child's descriptor)

    def unlink(self) -> None:
        """Removes the ring file (call after the daemon detached it). A missing file is not an error; a memfd ring
        has no file to remove (it is gone with its last descriptor and mapping)."""
        if self._forked or os.getpid() != self._pid:
            self._forked = True
            self._refuse()
        if self.path.startswith(_PROC_FD):
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RingWriter {self.path} capacity={self._cap} tail={self._tail}{' closed' if self._closed else ''}>"


def _raise_existing(path: str) -> None:
    """For an existing file: RingLockedError when a producer holds it (else the caller re-raises FileExistsError)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RingLockedError(f"kvshm: ring {path} is locked by another producer") from None
    finally:
        os.close(fd)
