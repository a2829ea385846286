"""The ring writer's ordered accesses to the shared header: the tail store that publishes (a release), the
doorbell's Dekker pair (a full fence between that store and the load of ``consumer_parked``), the futex wake, and
the other words whose order matters (state, loss_pending, head). shm/FORMAT.md, "Publication protocol" and
"Doorbell", gives the argument for x86-TSO and for ARMv8.

Native: :mod:`kvshm._ringsync`, a Limited-API (abi3) C extension in every platform wheel (pybind/csrc/_ringsync.c),
used on every CPU: XCHG then MOV on x86-64, STLR then LDAR on aarch64, futex(2) by this platform's syscall number.

Fallback, only where the extension is missing (a source tree nobody built) and only on x86-64: plain memoryview
accesses. Each is one aligned C store or load, and x86-TSO keeps stores in order, so the tail store is a release;
but nothing fences the tail store from the next load, so a doorbell can be missed (the consumer's park timeout
bounds that delay). On any other CPU there is no publication without the extension: :func:`unsupported` says why
and RingWriter.create refuses.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import struct
import sys
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from kvshm import _ringsync

__all__ = ["NATIVE", "PyWords", "Words", "make_words", "unsupported"]


# futex(2) for the fallback, which runs only on x86-64 (the extension takes SYS_futex from its platform's headers:
# 202 is aarch64's accept(2), so a wrong number would silently never ring).
_SYS_FUTEX_X86_64: Final = 202
_FUTEX_WAKE: Final = 1
_INT_MAX: Final = (1 << 31) - 1


def _load_native() -> type[_ringsync.Words] | None:
    """kvshm._ringsync.Words, or None where the extension is not built (a source tree)."""
    try:
        from kvshm._ringsync import Words as Native
    except ImportError:
        return None
    return Native


NATIVE: Final = _load_native()


def unsupported(native: bool) -> str | None:
    """Why this interpreter cannot publish into a ring (None when it can): the format is little-endian with 8-byte
    atomic words, and without the extension only x86-64's TSO makes a plain store a release."""
    machine = platform.machine() or "unknown"
    where = (f"{sys.implementation.name} on {machine} ({struct.calcsize('P') * 8}-bit, {sys.byteorder}-endian)")
    if sys.byteorder != "little" or struct.calcsize("P") != 8 or sys.implementation.name != "cpython":
        return f"kvshm: the ring writer needs a 64-bit little-endian CPython, this is {where}"
    if native and NATIVE is not None:
        return None
    if machine.lower() in ("x86_64", "amd64"):
        return None
    return (f"kvshm: the ring writer's C extension kvshm._ringsync is not installed, and on {where} the pure-Python "
            "publication (a plain 8-byte store, a release only under x86-TSO) would let the reader see the tail "
            "before the record bytes: install the kvshm wheel for this platform")


# What RingWriter needs from the header: the extension's Words, or the fallback with the same methods.
Words: TypeAlias = "_ringsync.Words | PyWords"


def make_words(mm: mmap.mmap, tail_offset: int, parked_offset: int, native: bool) -> Words:
    """The native Words when ``native`` and the extension is installed, else the x86-64 fallback (the caller has
    checked :func:`unsupported`)."""
    if native and NATIVE is not None:
        return NATIVE(mm, tail_offset, parked_offset)
    return PyWords(mm, tail_offset, parked_offset)


def _load_syscall() -> Any:
    """libc's ``syscall`` through ctypes, or None where it is unavailable (then the fallback never rings)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_SYSCALL: Final = _load_syscall()


class PyWords:
    """The x86-64 fallback: memoryview stores (releases under x86-TSO) and FUTEX_WAKE through ctypes. RingWriter
    does the tail store and the parked load inline when it has this (same as :meth:`publish`, without a call)."""

    __slots__ = ("q", "u32", "tail_index", "parked_index", "_anchor", "_addr")

    def __init__(self, mm: mmap.mmap, tail_offset: int, parked_offset: int) -> None:
        self.q = memoryview(mm).cast("Q")
        self.u32 = memoryview(mm).cast("I")
        self.tail_index = tail_offset >> 3
        self.parked_index = parked_offset >> 2
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(mm, tail_offset)  # exports mm, like q
        self._addr = ctypes.c_void_p(ctypes.addressof(self._anchor))

    def publish(self, tail: int) -> int:
        self.q[self.tail_index] = tail  # release under x86-TSO; no fence before the load below
        return self.u32[self.parked_index]

    def wake(self) -> int:
        if _SYSCALL is None:
            return -1
        r: int = _SYSCALL(ctypes.c_long(_SYS_FUTEX_X86_64), self._addr, ctypes.c_long(_FUTEX_WAKE),
                          ctypes.c_long(_INT_MAX), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
        return r

    def load_acquire(self, offset: int) -> int:
        v: int = self.q[offset >> 3]  # loads are not reordered with later loads or stores under x86-TSO
        return v

    def store_release(self, offset: int, value: int) -> None:
        self.q[offset >> 3] = value

    def store_release32(self, offset: int, value: int) -> None:
        self.u32[offset >> 2] = value

    def release(self) -> None:
        self.q.release()
        self.u32.release()
        self._anchor = None
