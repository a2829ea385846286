"""The producer side of a kvshm ring, in pure Python: events go straight into shared memory, no syscall, no lock.

A ring is an mmap'd regular file (layout version 1, shm/FORMAT.md): a 4096-byte header page, then a
power-of-two data area of 8-byte-aligned records ``[u32 length][u32 type][payload]``. The producer writes a record's
payload, then its header, then publishes it with ONE aligned 8-byte store of the tail word through
``memoryview.cast('Q')``; the Go reader (kvshmd) trusts everything before the tail. On x86-64 that store is a release
(x86-TSO keeps stores in program order, and each Python-level store is a separate C call the compiler cannot
reorder; glibc's memcpy fences its non-temporal large-copy path with sfence); on ARM64 and others it is not, so
:meth:`RingWriter.create` refuses to run anywhere but 64-bit CPython on x86-64.

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
  word becomes READY.
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
record header and every non-vector byte, slice copies write the vectors, one 8-byte store publishes, one 8-byte load
checks the doorbell. The head word (the consumer's) is read only when the cached head says the ring is full, or
when a lazy consumer's doorbell level may be reached (below).

Doorbell (FORMAT.md, "Doorbell"): a consumer with nothing to read for a while stores ``consumer_parked = 1`` (u32 at
0x208), re-checks the tail and sleeps in ``FUTEX_WAIT`` on the low 32 bits of the tail word, with a timeout. After
each tail store the writer loads ``consumer_parked`` (one memoryview item read) and, only when it is set, calls
``FUTEX_WAKE`` on the tail word through ``ctypes`` (``syscall(SYS_futex=202, addr, FUTEX_WAKE=1, ...)``, ~1-2 µs;
shared, not FUTEX_PRIVATE: the consumer is another process). A value above 1 is a doorbell level: ring only when
the bytes published past the consumer's head reach it (a consumer that drains on its own deadline and on queries,
and needs the doorbell only before its ring fills). That is the classic Dekker pair: store(tail) then
load(parked) here against store(parked) then load(tail) in the consumer. x86-TSO may reorder a store with a later
load (the store waits in the store buffer) and Python cannot issue a fence, so both sides can miss each other: the
consumer sleeps although the record is published. The consumer therefore always parks with a timeout (kvshmd:
10 ms for a stream it publishes, 1 s otherwise), which bounds that rare delay; no record is ever lost, only reached
late. Where ``ctypes`` or ``syscall`` is unavailable the writer never rings and the timeout is the only wakeup.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import platform
import re
import struct
import sys
import tempfile
import time
import weakref
from typing import Any, Final, SupportsIndex

from kvshm._encode import Prepared, check_seq_dp, prepare_cleared, prepare_removed, prepare_stored
from kvshm._errors import KvshmError

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
    "proc_stat",
    "ring_file_name",
    "sweep_stale_rings",
]

# Wire format: never change without bumping VERSION (mirrors shm/layout.go).
MAGIC: Final = b"KVSHMRG\x00"
VERSION: Final = 1
HEADER_SIZE: Final = 4096
OFF_STATE: Final = 0x048  # u32
OFF_TAIL: Final = 0x080  # u64, producer: the commit word
OFF_HEAD: Final = 0x100  # u64, consumer
OFF_DROPPED_EVENTS: Final = 0x180
OFF_DROPPED_BYTES: Final = 0x188
OFF_LOSS_FIRST: Final = 0x190
OFF_LOSS_LAST: Final = 0x198
OFF_LOSS_PENDING: Final = 0x1A0
OFF_HEARTBEAT: Final = 0x200
OFF_PARKED: Final = 0x208  # u32, consumer: the doorbell flag (the u64 at 0x208 is the flag plus 4 zero bytes)
STATE_INIT: Final = 0
STATE_READY: Final = 1
STATE_CLOSED: Final = 2
TYPE_EVENT: Final = 1
TYPE_LOSS: Final = 2
TYPE_PADDING: Final = 0xFFFFFFFF
RECORD_HEADER: Final = 8
LOSS_RECORD: Final = RECORD_HEADER + 24
MIN_CAPACITY: Final = 64 << 10
MAX_CAPACITY: Final = 4 << 30
# Static header fields 0x000..0x048: magic, version, header_size, capacity, max_record, flags, pid, reserved,
# producer_start_time, epoch, worker_id, kv_block_size, max_buffer_size.
_HEADER: Final = struct.Struct("<8sIIQIIIIQQQII")
_RECORD_HEADER: Final = struct.Struct("<II")
_LOSS: Final = struct.Struct("<IIQQQ")

_U32: Final = (1 << 32) - 1
_U64: Final = (1 << 64) - 1

# futex(2) on x86-64 (the only platform RingWriter runs on): SYS_futex = 202, FUTEX_WAKE = 1 (no FUTEX_PRIVATE_FLAG:
# the waiter is another process sharing the mapping).
SYS_FUTEX: Final = 202
FUTEX_WAKE: Final = 1
_INT_MAX: Final = (1 << 31) - 1


def _load_syscall() -> Any:
    """libc's ``syscall`` through ctypes (it releases the GIL during the call), or None where it is unavailable."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_SYSCALL: Final = _load_syscall()
# The arguments of the FUTEX_WAKE call, as full 64-bit C longs (syscall() is variadic and reads longs).
_C_SYS_FUTEX: Final = ctypes.c_long(SYS_FUTEX)
_C_FUTEX_WAKE: Final = ctypes.c_long(FUTEX_WAKE)
_C_WAKE_ALL: Final = ctypes.c_long(_INT_MAX)
_C_ZERO: Final = ctypes.c_long(0)


class RingError(KvshmError):
    """Base of the errors RingWriter raises (a :class:`kvshm.KvshmError`)."""


class RingPlatformError(RingError):
    """The machine is not x86-64: a plain 8-byte store from Python is not a release there."""


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


def check_platform() -> None:
    """Raises RingPlatformError unless this is a 64-bit little-endian x86-64 CPython (whose memoryview item store
    is one aligned 8-byte memcpy, i.e. one mov)."""
    machine = platform.machine().lower()
    if (machine not in ("x86_64", "amd64") or sys.byteorder != "little" or struct.calcsize("P") != 8
            or sys.implementation.name != "cpython"):
        raise RingPlatformError(
            f"kvshm: the pure-Python ring writer needs 64-bit CPython on x86-64, this is "
            f"{sys.implementation.name} on {platform.machine() or 'unknown'} ({struct.calcsize('P') * 8}-bit, "
            f"{sys.byteorder}-endian): it publishes records with a plain 8-byte "
            "store, which is a release only under x86-TSO; on other CPUs the reader could see the tail before the "
            "record bytes"
        )


def proc_stat(pid: int | str = "self") -> tuple[bytes, int] | None:
    """``(state, start_time)`` of ``/proc/<pid>/stat``: field 3 (the state letter, e.g. ``b"Z"`` for a zombie) and
    field 22 (start time, clock ticks since boot, what the ring header's ``producer_start_time`` holds). ``None``
    when the process does not exist; other ``OSError``s propagate. The command name (field 2) may contain spaces and
    parentheses, so fields are counted after the last ``)``. This is kvshm's one ``/proc/<pid>/stat`` parser in
    Python (Go: shm.ReadProcStat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    fields = raw[raw.rindex(b")") + 1 :].split()
    return fields[0], int(fields[19])


def _start_time() -> int:
    """Field 22 of /proc/self/stat (clock ticks since boot); 0 where /proc is missing."""
    try:
        st = proc_stat()
    except OSError:
        return 0
    return 0 if st is None else st[1]


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
        "_too_large", "_published", "_truncated", "_fd", "_pid", "_tail_word", "_tail_addr", "path", "epoch",
        "worker_id",
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
    _tail_word: ctypes.c_char | None  # exports mm (the tail word's address for FUTEX_WAKE); dropped before close
    _tail_addr: ctypes.c_void_p
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
    ) -> RingWriter:
        """Creates, preallocates, locks and maps a new ring file and returns its writer.

        With ``memfd`` the ring is an anonymous memory file sealed against shrinking and growing
        (``memfd_create`` + ``F_SEAL_SHRINK|F_SEAL_GROW``): no process can truncate it under the mapping (which
        would make the next publish a SIGBUS), it vanishes with its last user, and the daemon opens it as
        ``/proc/<pid>/fd/<n>`` (``path``); ``dir`` and ``name`` are not used.

        ``capacity`` is the data area size (a power of two in [64 KiB, 4 GiB]); ``max_record`` (bytes including the
        8-byte record header, a multiple of 8 in [32, capacity/8]) defaults to capacity/8; ``name`` defaults to
        ``kvshm-w<worker_id>-<pid>-<epoch>.ring``. Raises ValueError for invalid arguments, RingPlatformError off
        x86-64, RingLockedError when a live producer holds an existing file of that name, FileExistsError when a
        stale file has that name, RingSpaceError when the file system is full, OSError otherwise.
        """
        check_platform()
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
        _HEADER.pack_into(mm, 0, MAGIC, VERSION, HEADER_SIZE, capacity, max_record, 0, pid, 0, _start_time(), epoch,
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
        w._tail_word = ctypes.c_char.from_buffer(mm, OFF_TAIL)
        w._tail_addr = ctypes.c_void_p(ctypes.addressof(w._tail_word))
        w.path = path
        w.epoch = epoch
        w.worker_id = worker_id
        w.kv_block_size = kv_block_size
        w.max_buffer_size = max_buffer_size
        w._store_state(STATE_READY)  # release: after every header byte above
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
        q = self._q
        q[16] = end  # OFF_TAIL / 8. Release (x86-TSO): publishes the bytes written above.
        parked = q[65]  # OFF_PARKED / 8: the consumer sleeps on the doorbell (see the module docstring)
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
        if level != 1 and (end - self._head_cache < level or end - self._q[32] < level):  # OFF_HEAD / 8
            return
        if _SYSCALL is not None:
            _SYSCALL(_C_SYS_FUTEX, self._tail_addr, _C_FUTEX_WAKE, _C_WAKE_ALL, _C_ZERO, _C_ZERO, _C_ZERO)

    def _refresh_head(self, end: int) -> bool:
        """Loads the consumer's head (acquire on x86) and says whether ``end`` fits. A head ahead of the tail by at
        most a ring re-bases the writer there (shm/FORMAT.md, "Failure outcomes"); any other head no correct
        consumer stores (further ahead, misaligned, moving back) is treated as a full ring, never trusted."""
        head = self._q[32]  # OFF_HEAD / 8
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
        q = self._q
        q[16] = end  # Release: publishes the LOSS record and the event.
        parked = q[OFF_PARKED >> 3]
        if parked:
            self._ring_doorbell(end, parked)
        self._tail = end
        self._published += 1
        # After the tail store: the LOSS record in the stream is authoritative, the header fields are gauges.
        self._loss_pending = False
        self._loss_count = 0
        q[OFF_LOSS_PENDING >> 3] = 0
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
            q[OFF_LOSS_PENDING >> 3] = 1  # after loss_first_seq and loss_last_seq

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

    def _store_state(self, state: int) -> None:
        words = memoryview(self._mm).cast("I")
        try:
            words[OFF_STATE >> 2] = state  # one aligned 4-byte store; release on x86
        finally:
            words.release()

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
            self._store_state(STATE_CLOSED)
        self._q.release()  # mmap.close() refuses while a memoryview is exported
        self._tail_word = None  # the ctypes object exports the buffer too
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


# Ring files kvshm names (ring_file_name): kvshm-w<worker_id>-<pid>-<epoch>.ring.
_RING_NAME: Final = re.compile(r"kvshm-w\d+-(\d+)-\d+\.ring")
_RING_IDENTITY: Final = struct.Struct("<8s24xIIQ")  # magic .. producer_pid (0x20) .. producer_start_time (0x28)


def ring_file_name(worker_id: int, pid: int, epoch: int) -> str:
    """The file name RingWriter.create gives a ring by default (sweep_stale_rings only considers such names)."""
    return f"kvshm-w{worker_id}-{pid}-{epoch}.ring"


def sweep_stale_rings(directory: str) -> list[str]:
    """Remove ring files (``kvshm-w<worker>-<pid>-<epoch>.ring``, ours) whose producer is gone, return their paths.

    A file is stale when its header is complete (magic written), its producer process no longer runs (pid gone or
    reused: start time differs) and nobody holds its flock (a live RingWriter always does). Unlinking is safe for a
    daemon still draining it: its mapping outlives the name. Best effort: errors skip the file.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        if not _RING_NAME.fullmatch(name):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != uid or not (st.st_mode & 0o170000 == 0o100000):
                continue
            header = os.pread(fd, _RING_IDENTITY.size, 0)
            if len(header) < _RING_IDENTITY.size:
                continue
            magic, pid, _, start_time = _RING_IDENTITY.unpack(header)
            if magic != MAGIC or _process_running(pid, start_time):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live producer holds it
            os.unlink(path)
            removed.append(path)
            log.info("kvshm: removed the stale ring %s of dead producer pid %d", path, pid)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _process_running(pid: int, start_time: int) -> bool:
    """Whether ``pid`` runs and (when ``start_time`` is known) is the process that started at that time."""
    if pid <= 0:
        return False
    try:
        st = proc_stat(pid)
    except OSError:
        return True  # cannot tell: keep the file
    if st is None or st[0] in (b"Z", b"X"):
        return False
    return start_time == 0 or st[1] == start_time


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
