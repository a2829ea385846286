"""kvshm._ringsync, the C extension that orders the ring writer's header accesses (kvshm._words), and the x86-64
pure-Python fallback: the same words land in the same bytes, the checks refuse what would write out of bounds, and a
released Words never touches the buffer again. The doorbell's wake is tested end to end in test_doorbell.py; the
orderings themselves are a property of the instructions (shm/FORMAT.md), which no test on one x86 box can show.

Run: PYTHONPATH=pybind/src .venv/bin/python -m pytest pybind/tests/test_ringsync.py (after `make wheel`, or
``cd pybind && python setup.py build_ext --inplace`` for a source tree)
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator

import pytest

from kvshm import _words

OFF_TAIL = 0x080  # independent statement of the layout (shm/FORMAT.md)
OFF_PARKED = 0x208
OFF_STATE = 0x048
OFF_LOSS_PENDING = 0x1A0

native_only = pytest.mark.skipif(_words.NATIVE is None, reason="kvshm._ringsync is not built (`make wheel`)")


def _kinds() -> list[str]:
    kinds = []
    if _words.NATIVE is not None:
        kinds.append("extension")
    if _words.unsupported(False) is None:
        kinds.append("x86-64-fallback")
    return kinds


@pytest.fixture(params=_kinds())
def words(request: pytest.FixtureRequest) -> Iterator[tuple[_words.Words, mmap.mmap]]:
    mm = mmap.mmap(-1, 8192)
    w = _words.make_words(mm, OFF_TAIL, OFF_PARKED, request.param == "extension")
    yield w, mm
    w.release()
    mm.close()


def test_publish_stores_the_tail_and_returns_parked(words: tuple[_words.Words, mmap.mmap]) -> None:
    w, mm = words
    assert w.publish(8) == 0
    assert struct.unpack_from("<Q", mm, OFF_TAIL)[0] == 8
    struct.pack_into("<I", mm, OFF_PARKED, 7)
    assert w.publish(2**64 - 8) == 7
    assert struct.unpack_from("<Q", mm, OFF_TAIL)[0] == 2**64 - 8
    struct.pack_into("<I", mm, OFF_PARKED + 4, 1)  # the reserved half next to the flag is not the flag
    struct.pack_into("<I", mm, OFF_PARKED, 0)
    assert w.publish(16) in (0, 1 << 32)  # the fallback loads the u64 (flag + reserved zero): nonzero either way


def test_loads_and_stores(words: tuple[_words.Words, mmap.mmap]) -> None:
    w, mm = words
    w.store_release(OFF_LOSS_PENDING, 0x0102030405060708)
    assert mm[OFF_LOSS_PENDING : OFF_LOSS_PENDING + 8] == bytes.fromhex("0807060504030201")
    assert w.load_acquire(OFF_LOSS_PENDING) == 0x0102030405060708
    w.store_release32(OFF_STATE, 2)
    assert struct.unpack_from("<II", mm, OFF_STATE) == (2, 0)
    assert w.wake() == 0  # nobody waits on the tail word


@native_only
@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda w: w.load_acquire(8192), ValueError),  # past the end
        (lambda w: w.load_acquire(8190), ValueError),
        (lambda w: w.load_acquire(4), ValueError),  # misaligned
        (lambda w: w.load_acquire(-8), ValueError),
        (lambda w: w.store_release(8184 + 1, 1), ValueError),
        (lambda w: w.store_release32(8192, 1), ValueError),
        (lambda w: w.store_release32(2, 1), ValueError),
        (lambda w: w.store_release32(0, 1 << 32), OverflowError),
        (lambda w: w.store_release(0, -1), OverflowError),
        (lambda w: w.store_release(0, 1 << 64), OverflowError),
        (lambda w: w.publish(-1), OverflowError),
        (lambda w: w.publish("8"), TypeError),
        (lambda w: w.store_release(0), TypeError),
    ],
)
def test_extension_refuses_out_of_bounds(call: Callable[[_words.Words], object], exc: type[Exception]) -> None:
    assert _words.NATIVE is not None
    mm = mmap.mmap(-1, 8192)
    w = _words.NATIVE(mm, OFF_TAIL, OFF_PARKED)
    before = bytes(mm)
    with pytest.raises(exc):
        call(w)
    assert bytes(mm) == before, "a refused call wrote"
    w.release()
    mm.close()


@native_only
def test_extension_construction_and_release() -> None:
    assert _words.NATIVE is not None
    mm = mmap.mmap(-1, 4096)
    for tail, parked in ((4096, OFF_PARKED), (OFF_TAIL, 4094), (4, OFF_PARKED)):
        with pytest.raises(ValueError):
            _words.NATIVE(mm, tail, parked)
    with pytest.raises(BufferError):
        _words.NATIVE(bytes(4096), OFF_TAIL, OFF_PARKED)  # type: ignore[arg-type]  # read-only
    w = _words.NATIVE(mm, OFF_TAIL, OFF_PARKED)
    with pytest.raises(BufferError):
        mm.close()  # the export pins the mapping
    w.release()
    w.release()  # idempotent
    for call in (lambda: w.publish(8), w.wake, lambda: w.load_acquire(0), lambda: w.store_release(0, 1)):
        with pytest.raises(ValueError, match="released"):
            call()
    mm.close()  # the export is gone
