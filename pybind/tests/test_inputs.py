"""numpy inputs, as engines hand them over: integer scalars wherever an int is taken and arrays wherever an id list
is, accepted without kvshm importing numpy (operator.index, tolist()), encoded to exactly the bytes of the same
values as Python ints. numpy is a test dependency only (pinned in pybind/requirements-dev.txt)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from kvshm import _encode

from conftest import IndexerFactory
from helpers import toks

U64 = 1 << 64
BIG = (1 << 64) - 3  # >= 2**63: not an i64
NEG = -5  # a signed hash: u64 2**64 - 5


def test_kvshm_does_not_import_numpy() -> None:
    """The package never imports numpy itself (the engine may not have it; importing it costs ~100 ms)."""
    import subprocess

    code = "import kvshm, kv_local_indexer, kvshm._encode, kvshm._indexer, sys; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# (name, numpy call, the same event with Python ints)
STORED: list[tuple[str, tuple[Any, ...], tuple[Any, ...]]] = [
    (
        "scalars",
        (np.uint64(7), [1, 2, 3, 4], [np.uint64(BIG)], np.int64(NEG), np.int32(3)),
        (7, [1, 2, 3, 4], [BIG], U64 + NEG, 3),
    ),
    (
        "arrays",
        (np.int64(8), np.arange(4, dtype=np.int32), np.array([BIG, 1], dtype=np.uint64), np.uint64(BIG), np.uint8(1)),
        (8, [0, 1, 2, 3], [BIG, 1], BIG, 1),
    ),
    (
        "signed hash array",
        (9, np.arange(8, dtype=np.uint32), np.array([NEG, -(1 << 63)], dtype=np.int64), None, 0),
        (9, list(range(8)), [U64 + NEG, 1 << 63], None, 0),
    ),
    (
        "mixed scalars (slow path)",
        (10, [np.int64(1), np.uint16(2)], [np.int64(NEG), np.uint64(BIG)], np.int16(-1), np.int64(0)),
        (10, [1, 2], [U64 + NEG, BIG], U64 - 1, 0),
    ),
    (
        "token array of uint16",
        (11, np.array([5, 6, 7, 8], dtype=np.uint16), np.array([3], dtype=np.int64), None, np.uint32(4)),
        (11, [5, 6, 7, 8], [3], None, 4),
    ),
]


@pytest.mark.parametrize(("name", "numpy_args", "int_args"), STORED, ids=[c[0] for c in STORED])
def test_numpy_encodes_like_ints(name: str, numpy_args: tuple[Any, ...], int_args: tuple[Any, ...]) -> None:
    got = _encode.encode_stored(*numpy_args)
    assert got == _encode.encode_stored(*int_args), name
    seq, _, hashes, _, dp = numpy_args
    want_seq, _, want_hashes, _, want_dp = int_args
    assert _encode.encode_removed(seq, hashes, dp) == _encode.encode_removed(want_seq, want_hashes, want_dp)
    assert _encode.encode_cleared(seq, dp) == _encode.encode_cleared(want_seq, want_dp)


@pytest.mark.parametrize(
    ("values", "exc"),
    [
        (np.array(5, dtype=np.uint64), TypeError),  # 0-d: a scalar, not a list
        (np.array([1.5]), TypeError),
        (np.array([[1, 2]], dtype=np.uint64), TypeError),  # 2-D: a list of lists
        (np.array([1], dtype=np.bool_), None),  # bools are integers to Python (and to the old extension)
        (np.array([-1], dtype=np.int64), None),  # a signed hash
        (np.frombuffer(b"ab", dtype=np.uint8), None),  # a numpy array of bytes is an array of small ints
    ],
    ids=["0-d", "float", "2-D", "bool", "negative", "uint8"],
)
def test_numpy_hash_arrays(values: Any, exc: type[Exception] | None) -> None:
    if exc is None:
        _encode.encode_removed(1, values)
        return
    with pytest.raises(exc, match="kvshm"):
        _encode.encode_removed(1, values)


def test_numpy_token_out_of_range() -> None:
    with pytest.raises(ValueError, match="kvshm"):
        _encode.encode_stored(1, np.array([1 << 32], dtype=np.int64), [1], None)
    with pytest.raises(ValueError, match="kvshm"):
        _encode.encode_stored(1, np.array([-1], dtype=np.int64), [1], None)


def test_localindexer_takes_numpy(make_indexer: IndexerFactory) -> None:
    """The same stream published with numpy values and with Python ints: the daemon answers the same bytes."""
    a = make_indexer(np.uint64(3), np.int64(4), np.int32(100))
    b = make_indexer(3, 4, 100)
    a.apply_stored(np.uint64(0), np.arange(8, dtype=np.int64), np.array([BIG, 12], dtype=np.uint64))
    b.apply_stored(0, toks(0, 8), [BIG, 12])
    a.apply_stored(np.int32(1), toks(8, 4), [np.int64(NEG)], parent_hash=np.int64(12), dp_rank=np.int64(0))
    b.apply_stored(1, toks(8, 4), [NEG], parent_hash=12, dp_rank=0)
    a.apply_removed(np.uint8(2), np.array([NEG], dtype=np.int64))
    b.apply_removed(2, [NEG])
    a.apply_cleared(np.int64(3), dp_rank=np.uint32(0))
    b.apply_cleared(3, dp_rank=0)
    a.apply_stored(np.uint16(4), np.arange(4, dtype=np.uint32), (np.uint64(5),))
    b.apply_stored(4, toks(0, 4), [5])
    for start, end in ((0, None), (2, 4), (None, None)):
        np_start = None if start is None else np.int64(start)
        np_end = None if end is None else np.uint64(end)
        assert a.get_events_json(np_start, np_end) == b.get_events_json(start, end)

SIGNED = [NEG, 7, -(1 << 63), (1 << 63) - 1]
UNSIGNED = [h % U64 for h in SIGNED]


@pytest.mark.parametrize(
    "hashes",
    [
        np.array(SIGNED, dtype=np.int64),  # buffer path: the bytes are the u64s
        np.array(UNSIGNED, dtype=np.uint64),
        np.array(SIGNED, dtype=">i8"),  # big-endian: the checked tolist() path
        np.array([x for h in SIGNED for x in (h, 0)], dtype=np.int64)[::2],  # strided: not contiguous
        np.array([[h] for h in SIGNED], dtype=np.int64)[:, 0],  # a column: strided too
    ],
    ids=["int64", "uint64", "big-endian", "strided", "column"],
)
def test_hash_arrays_every_layout(hashes: Any) -> None:
    assert _encode.encode_removed(1, hashes) == _encode.encode_removed(1, UNSIGNED)


@pytest.mark.parametrize(
    ("tokens", "exc"),
    [
        (np.array([1, 2, 3], dtype=np.uint32), None),  # buffer path
        (np.array([1, 2, 3], dtype=np.int32), None),
        (np.array([1, 2, 3], dtype=">u4"), None),
        (np.array([1, 0, 2, 0, 3, 0], dtype=np.uint32)[::2], None),
        (np.array([1, -2, 3], dtype=np.int32), ValueError),
        (np.array([1, 1 << 32, 3], dtype=np.uint64), ValueError),
    ],
    ids=["uint32", "int32", "big-endian", "strided", "negative", "too large"],
)
def test_token_arrays_every_layout(tokens: Any, exc: type[Exception] | None) -> None:
    if exc is not None:
        with pytest.raises(exc, match="kvshm"):
            _encode.encode_stored(1, tokens, [5], None)
        return
    assert _encode.encode_stored(1, tokens, [5], None) == _encode.encode_stored(1, [1, 2, 3], [5], None)


def test_buffers_are_released() -> None:
    """The buffer path leaves no export behind: the caller may resize its array right after the call."""
    from array import array

    hashes, tokens = array("q", SIGNED), array("I", [1, 2, 3])
    _encode.encode_stored(1, tokens, hashes, None)
    hashes.append(1)  # BufferError if a memoryview were still exported
    tokens.append(4)
