"""The ring's doorbell (shm/FORMAT.md, "Doorbell"): after a publish RingWriter calls FUTEX_WAKE on the tail word only
while the consumer's ``consumer_parked`` word is set. A thread of this test plays the parked consumer: it maps the
ring file a second time (another address, the same shared futex key, as in another process) and sleeps in its own
FUTEX_WAIT on the tail word. The Go side of the protocol is tested in shm/park_test.go.

Run: PYTHONPATH=pybind/src .venv/bin/python -m pytest pybind/tests/test_doorbell.py
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvshm import _words
from kvshm._ring import RingWriter

# Independent statement of the layout and of futex(2) (not imported from kvshm).
OFF_TAIL = 0x080
OFF_HEAD = 0x100
OFF_PARKED = 0x208
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}  # 202 is aarch64's accept(2)
SYS_FUTEX = _SYS_FUTEX[platform.machine()]
# /proc/<pid>/task/<tid>/syscall shows the kernel's numbering: under qemu-user (an aarch64 Python on an x86-64
# kernel) the host's futex number, not this CPU's.
try:
    KERNEL_SYS_FUTEX = _SYS_FUTEX[Path("/proc/sys/kernel/arch").read_text().strip()]
except (OSError, KeyError):
    KERNEL_SYS_FUTEX = SYS_FUTEX
FUTEX_WAIT = 0
WAIT_TIMEOUT = 5.0  # a missed wake shows up as ETIMEDOUT, not as a slow test

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(addr: int, val: int, timeout: float) -> int:
    """FUTEX_WAIT (shared) on addr while *addr == val; returns 0 when woken, else the errno."""
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    r = _libc.syscall(ctypes.c_long(SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_long(FUTEX_WAIT),
                      ctypes.c_long(val), ctypes.byref(ts), ctypes.c_void_p(None), ctypes.c_long(0))
    return 0 if r == 0 else ctypes.get_errno()


class Consumer:
    """A second mapping of the ring, standing in for kvshmd's Reader."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(self._fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.q = memoryview(self.mm).cast("Q")
        self.words = memoryview(self.mm).cast("I")
        self._tail_word = ctypes.c_uint32.from_buffer(self.mm, OFF_TAIL)
        self.tail_addr = ctypes.addressof(self._tail_word)
        self.result: list[int] = []

    def park_in_thread(self, timeout: float) -> threading.Thread:
        """Starts a thread that FUTEX_WAITs on the current tail and returns once it sleeps in the kernel."""
        val = self.words[OFF_TAIL >> 2]
        th = threading.Thread(target=lambda: self.result.append(_futex_wait(self.tail_addr, val, timeout)))
        th.start()
        want = f"{KERNEL_SYS_FUTEX} {self.tail_addr:#x} 0x0 "
        deadline = time.monotonic() + 10
        while th.native_id is None:
            time.sleep(0.0001)
        task = Path(f"/proc/self/task/{th.native_id}/syscall")
        while True:
            try:
                if task.read_text().startswith(want):
                    return th
            except OSError:
                th.join()
                pytest.skip("cannot read /proc/self/task/*/syscall to see the waiter in FUTEX_WAIT")
            if self.result or time.monotonic() > deadline:
                th.join()
                pytest.fail(f"the waiter did not reach FUTEX_WAIT (returned {self.result})")
            time.sleep(0.0001)

    def drain(self) -> None:
        """Releases everything published (head = tail), as a consumer does."""
        self.q[OFF_HEAD >> 3] = self.q[OFF_TAIL >> 3]

    def close(self) -> None:
        del self._tail_word
        self.q.release()
        self.words.release()
        self.mm.close()
        os.close(self._fd)


@pytest.fixture(params=[True, False], ids=["extension", "x86-64-fallback"])
def ring(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[RingWriter, Consumer]]:
    """A writer with either publication (kvshm._words): the C extension, or the pure-Python one where it is allowed."""
    native: bool = request.param
    if native and _words.NATIVE is None:
        pytest.skip("kvshm._ringsync is not built (a source tree: `make wheel` builds it)")
    if not native and _words.unsupported(False) is not None:
        pytest.skip(f"no pure-Python publication on {platform.machine()}")
    w = RingWriter.create(str(tmp_path), worker_id=1, kv_block_size=4, max_buffer_size=100, capacity=64 << 10,
                          native=native)
    c = Consumer(w.path)
    yield w, c
    c.close()
    w.close()


def _fill_until_drop(w: RingWriter) -> None:
    seq = 0
    while w.publish_removed(seq, list(range(200)), 0):
        seq += 1
    assert w.stats()["loss_pending"]


@pytest.mark.parametrize("after_loss", [False, True], ids=["publish", "publish-after-loss"])
def test_publish_wakes_a_parked_consumer(ring: tuple[RingWriter, Consumer], after_loss: bool) -> None:
    w, c = ring
    if after_loss:  # the LOSS + event publication is a separate code path
        _fill_until_drop(w)
        c.drain()
    c.words[OFF_PARKED >> 2] = 1
    th = c.park_in_thread(WAIT_TIMEOUT)
    assert w.publish_cleared(10_000, 0)
    th.join()
    assert c.result == [0], f"waiter returned errno {c.result} (ETIMEDOUT={errno.ETIMEDOUT}): the doorbell did not ring"
    assert w.stats()["loss_pending"] is False


def test_no_doorbell_while_the_consumer_polls(ring: tuple[RingWriter, Consumer]) -> None:
    w, c = ring
    assert c.words[OFF_PARKED >> 2] == 0
    th = c.park_in_thread(0.3)
    assert w.publish_cleared(1, 0)
    th.join()
    assert c.result == [errno.ETIMEDOUT], "FUTEX_WAKE was called although consumer_parked is 0"


@pytest.mark.parametrize("after_loss", [False, True], ids=["publish", "publish-after-loss"])
def test_doorbell_level(ring: tuple[RingWriter, Consumer], after_loss: bool) -> None:
    """A lazy consumer's level (FORMAT.md, "Doorbell", Levels): consumer_parked = P > 1 rings only once the bytes
    published past the head reach P; a publication below it leaves the consumer asleep."""
    w, c = ring
    if after_loss:
        _fill_until_drop(w)
        c.drain()
    head = c.q[OFF_HEAD >> 3]
    level = 1024
    c.words[OFF_PARKED >> 2] = level
    th = c.park_in_thread(0.3)
    assert w.publish_cleared(1, 0)  # a record of a few dozen bytes: below the level
    th.join()
    assert c.result == [errno.ETIMEDOUT], "FUTEX_WAKE was called below the consumer's doorbell level"
    assert c.q[OFF_TAIL >> 3] - head < level
    seq = 2
    while c.q[OFF_TAIL >> 3] + 200 - head < level:  # publish until the next record (< 200 B) may reach it
        assert w.publish_cleared(seq, 0)
        seq += 1
    c.result.clear()
    th = c.park_in_thread(WAIT_TIMEOUT)
    while c.q[OFF_TAIL >> 3] - head < level:
        assert w.publish_cleared(seq, 0)
        seq += 1
    th.join()
    assert c.result == [0], f"waiter returned errno {c.result}: the doorbell did not ring at the level"
