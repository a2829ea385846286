"""RingWriter against the ring layout (shm/FORMAT.md), parsed here with independent code.

Run: PYTHONPATH=pybind/src .venv/bin/python -m pytest pybind/tests/test_ring.py
The Go side (shm/python_stress_test.go) reads Python-written rings with the Go Reader.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import platform
import random
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvshm import _encode, _proc, _ring, _words
from kvshm._ring import (
    RingClosedError,
    RingForkedError,
    RingLockedError,
    RingPlatformError,
    RingSpaceError,
    RingWriter,
)

REPO = Path(__file__).resolve().parents[2]
RING_VECTORS = REPO / "testdata" / "ring"
EVENT_VECTORS = REPO / "testdata" / "events"

# Independent statement of the layout (not imported from _ring).
HDR = struct.Struct("<8sIIQIIIIQQQIII")  # static fields + state, 0x000..0x04C
FIELDS = ("magic", "version", "header_size", "capacity", "max_record", "flags", "producer_pid", "reserved",
          "producer_start_time", "epoch", "worker_id", "kv_block_size", "max_buffer_size", "state")
COUNTERS = {"tail": 0x80, "head": 0x100, "dropped_events": 0x180, "dropped_bytes": 0x188, "loss_first_seq": 0x190,
            "loss_last_seq": 0x198, "loss_pending": 0x1A0, "consumer_heartbeat": 0x200}
DATA = 4096
PADDING = 0xFFFFFFFF


class BadRing(Exception):
    pass


@dataclass
class Ring:
    header: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    padding: list[dict[str, int]] = field(default_factory=list)


def parse(image: bytes, head: int | None = None) -> Ring:
    """Parses a ring image: header, then every record in [head, tail)."""
    if len(image) < DATA:
        raise BadRing("short file")
    h = dict(zip(FIELDS, HDR.unpack_from(image, 0)))
    for name, off in COUNTERS.items():
        h[name] = struct.unpack_from("<Q", image, off)[0]
    if h["magic"] != b"KVSHMRG\x00":
        raise BadRing(f"bad magic {h['magic']!r}")
    if h["version"] != 1 or h["header_size"] != DATA:
        raise BadRing(f"version {h['version']} / header size {h['header_size']}")
    cap = h["capacity"]
    if cap & (cap - 1) or len(image) != DATA + cap:
        raise BadRing("capacity / file size")
    ring = Ring(h)
    pos = h["head"] if head is None else head
    tail = h["tail"]
    if not (pos <= tail <= pos + cap and pos % 8 == 0 and tail % 8 == 0):
        raise BadRing(f"positions head {pos} tail {tail}")
    while pos < tail:
        idx = pos & (cap - 1)
        length, typ = struct.unpack_from("<II", image, DATA + idx)
        if typ == PADDING:
            if length != cap - idx:
                raise BadRing(f"padding at {pos} has length {length}, want {cap - idx}")
            ring.padding.append({"pos": pos, "index": idx, "length": length})
            pos += length
            continue
        if typ not in (1, 2) or length < 8 or length > h["max_record"]:
            raise BadRing(f"record at {pos}: type {typ} length {length}")
        size = (length + 7) & ~7
        if pos + size > tail or idx + size > cap:
            raise BadRing(f"record at {pos} runs past the tail or the end")
        rec = {"pos": pos, "index": idx, "type": typ, "length": length,
               "payload": bytes(image[DATA + idx + 8:DATA + idx + length])}
        if typ == 2:
            if length != 32:
                raise BadRing("LOSS record length")
            rec["first_seq"], rec["last_seq"], rec["count"] = struct.unpack("<QQQ", rec["payload"])
        ring.records.append(rec)
        pos += size
    return ring


def read(path: str, head: int | None = None) -> Ring:
    return parse(Path(path).read_bytes(), head)


class Consumer:
    """Plays the daemon's part: maps the file and stores head."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "r+b")
        self.mm = mmap.mmap(self.f.fileno(), 0)
        self.q = memoryview(self.mm).cast("Q")

    def drain(self) -> Ring:
        ring = parse(bytes(self.mm))
        self.q[0x100 // 8] = ring.header["tail"]
        return ring

    def close(self) -> None:
        self.q.release()
        self.mm.close()
        self.f.close()


@pytest.fixture()
def ring_dir(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path)


def new_writer(d: str, capacity: int = 64 << 10, **kw: Any) -> RingWriter:
    return RingWriter.create(d, 7, 16, 1000, capacity, **kw)


@pytest.fixture(params=[True, False], ids=["extension", "x86-64-fallback"])
def native(request: pytest.FixtureRequest) -> bool:
    """Both publications (kvshm._words): the C extension, and the pure-Python one where it is allowed (x86-64)."""
    want: bool = request.param
    if want and _words.NATIVE is None:
        pytest.skip("kvshm._ringsync is not built (a source tree: `make wheel` builds it)")
    if not want and _words.unsupported(False) is not None:
        pytest.skip(f"no pure-Python publication on {platform.machine()}")
    return want


# ---------------------------------------------------------------------------------------------------------------
# Go-written images read by this parser


@pytest.mark.parametrize("name", sorted(p.stem for p in RING_VECTORS.glob("*.ring")))
def test_go_ring_images(name: str) -> None:
    want = json.loads((RING_VECTORS / f"{name}.json").read_text())
    image = (RING_VECTORS / f"{name}.ring").read_bytes()
    assert len(image) == want["file_size"]
    ring = parse(image)
    wh = want["header"]
    assert ring.header["magic"] == bytes.fromhex(wh["magic_hex"])
    for k, v in wh.items():
        if k != "magic_hex":
            assert ring.header[k] == v, k
    got = [{k: r[k] for k in ("pos", "index", "type", "length")} | {"payload_hex": r["payload"].hex()}
           | ({k: r[k] for k in ("first_seq", "last_seq", "count")} if r["type"] == 2 else {})
           for r in ring.records]
    assert got == want["records"]
    assert ring.padding == want["padding"]


def test_go_ring_images_exist() -> None:
    assert {"basic", "wrap", "loss"} <= {p.stem for p in RING_VECTORS.glob("*.ring")}


def test_parser_refuses_bad_headers() -> None:
    image = bytearray((RING_VECTORS / "basic.ring").read_bytes())
    for off, val, what in ((0, b"X", "magic"), (8, b"\x02", "version")):
        bad = bytearray(image)
        bad[off:off + len(val)] = val
        with pytest.raises(BadRing, match=what):
            parse(bytes(bad))


# ---------------------------------------------------------------------------------------------------------------
# Python-written rings


def vector_events() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(EVENT_VECTORS.glob("*.json"))]


def publish(w: RingWriter, ev: dict[str, Any]) -> bool:
    if ev["kind"] == "stored":
        return w.publish_stored(ev["seq"], ev["token_ids"], ev["block_hashes"], ev["parent_hash"], ev["dp_rank"],
                                ev["lora_name"], ev["is_eagle"])
    if ev["kind"] == "removed":
        return w.publish_removed(ev["seq"], ev["block_hashes"], ev["dp_rank"])
    return w.publish_cleared(ev["seq"], ev["dp_rank"])


def test_header_and_vectors(ring_dir: str) -> None:
    w = RingWriter.create(ring_dir, 2**64 - 1, 32, 12345, 1 << 16, max_record=8192)
    try:
        st = os.stat(w.path)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == 4096 + (1 << 16)
        assert st.st_blocks * 512 >= st.st_size, "file not preallocated"
        assert Path(w.path).parent == Path(ring_dir)
        events = vector_events()
        for _, ev in events:
            assert publish(w, ev)
        ring = read(w.path)
        h = ring.header
        assert (h["capacity"], h["max_record"], h["flags"], h["state"]) == (1 << 16, 8192, 0, 1)
        assert (h["worker_id"], h["kv_block_size"], h["max_buffer_size"]) == (2**64 - 1, 32, 12345)
        assert h["producer_pid"] == os.getpid() and h["epoch"] == w.epoch and w.epoch > 0
        proc = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/stat").read_bytes()  # the kernel's, also under qemu
        assert h["producer_start_time"] == int(proc[proc.rindex(b")") + 1:].split()[19])
        assert h["dropped_events"] == 0 and h["loss_pending"] == 0
        assert [r["payload"] for r in ring.records] == [
            (EVENT_VECTORS / f"{name}.bin").read_bytes() for name, _ in events]
        assert all(r["type"] == 1 and r["pos"] % 8 == 0 for r in ring.records)
    finally:
        w.close()
    assert read(w.path).header["state"] == 2, "close stores CLOSED"
    assert os.path.exists(w.path), "close keeps the file for the reader"
    w.close()  # idempotent
    with pytest.raises(RingClosedError):
        w.publish_cleared(1, 0)
    w.unlink()
    assert not os.path.exists(w.path)
    w.unlink()  # a missing file is fine


def test_default_dir_and_mode(ring_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHM_RING_DIR", ring_dir)
    assert _ring.default_dir() == ring_dir
    w = RingWriter.create(None, 1, 16, 10, 1 << 16, mode=0o640)
    try:
        assert os.path.dirname(w.path) == ring_dir
        assert stat.S_IMODE(os.stat(w.path).st_mode) == 0o640, "mode set exactly, whatever the umask"
    finally:
        w.close()
    monkeypatch.delenv("KVSHM_RING_DIR")
    assert _ring.default_dir() == ("/dev/shm" if os.path.isdir("/dev/shm") else __import__("tempfile").gettempdir())


def test_wraparound_many_times(ring_dir: str, native: bool) -> None:
    """Random sizes through a 64 KiB ring with a consumer: contiguous seqs, exact payloads, padding at the end."""
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    w = new_writer(ring_dir, native=native)
    c = Consumer(w.path)
    try:
        seq = 0
        paddings = 0
        expect: list[bytes] = []
        got: list[bytes] = []
        while seq < 3000:
            for _ in range(rng.randrange(1, 12)):
                seq += 1
                n = rng.randrange(0, 60)
                toks = [rng.getrandbits(32) for _ in range(n * 4)]
                hashes = [rng.getrandbits(64) for _ in range(n)]
                if not w.publish_stored(seq, toks, hashes, seq - 1 if seq % 3 else None, seq % 4, None, False):
                    pytest.fail(f"seed {seed}: ring full although drained")
                expect.append(_encode.encode_stored(seq, toks, hashes, seq - 1 if seq % 3 else None, seq % 4))
            ring = c.drain()
            paddings += len(ring.padding)
            got.extend(r["payload"] for r in ring.records)
        assert got == expect, f"seed {seed}"
        assert paddings > 10, f"seed {seed}: only {paddings} wraps"
        assert w.stats()["tail"] > 20 * (64 << 10)
    finally:
        c.close()
        w.close()


def test_ring_full_drops_and_reports_loss(ring_dir: str, native: bool) -> None:
    w = new_writer(ring_dir, native=native)
    c = Consumer(w.path)
    try:
        toks, hashes = list(range(64)), list(range(4))
        seq = 0
        while True:
            seq += 1
            if not w.publish_stored(seq, toks, hashes, None, 0, None, False):
                break
        size = len(_encode.encode_stored(seq, toks, hashes, None))
        tail = w.stats()["tail"]
        many = list(range(48))  # a Removed record larger than the stored one: cannot fit either
        for s in (seq + 1, seq + 2):  # still full: returns at once, counted, nothing written
            assert not w.publish_removed(s, many, 0)
        assert not w.publish_stored(seq + 3, toks, hashes, None, 1, None, False)
        st = w.stats()
        assert st["tail"] == tail
        assert (st["dropped_events"], st["loss_pending"], st["loss_first_seq"], st["loss_last_seq"]) == (
            4, True, seq, seq + 3)
        h = read(w.path).header
        dropped_bytes = (size + len(_encode.encode_removed(1, many)) * 2
                         + len(_encode.encode_stored(1, toks, hashes, None, 1)))
        assert (h["dropped_events"], h["dropped_bytes"], h["loss_pending"]) == (4, dropped_bytes, 1)
        assert (h["loss_first_seq"], h["loss_last_seq"]) == (seq, seq + 3)
        first = c.drain()
        assert [r["type"] for r in first.records] == [1] * (seq - 1)
        assert w.publish_cleared(seq + 4, 0)
        ring = c.drain()
        assert [r["type"] for r in ring.records] == [2, 1]
        loss = ring.records[0]
        assert (loss["first_seq"], loss["last_seq"], loss["count"]) == (seq, seq + 3, 4)
        assert ring.records[1]["payload"] == _encode.encode_cleared(seq + 4)
        st = w.stats()
        assert not st["loss_pending"] and read(w.path).header["loss_pending"] == 0
        assert st["dropped_events"] == 4, "totals stay"
        # A second loss: the LOSS record counts only the drops since the last one.
        w2_seq = seq + 5
        while w.publish_cleared(w2_seq, 0):
            w2_seq += 1
        c.drain()
        assert w.publish_cleared(w2_seq + 1, 0)
        loss2 = c.drain().records[0]
        assert (loss2["type"], loss2["first_seq"], loss2["last_seq"], loss2["count"]) == (2, w2_seq, w2_seq, 1)
    finally:
        c.close()
        w.close()


@pytest.mark.parametrize("ahead,rebased", [(1 << 20, False), ((64 << 10) + 4, False), (64 << 10, True)])
def test_rebases_at_a_head_ahead_of_the_tail(ring_dir: str, ahead: int, rebased: bool, native: bool) -> None:
    """A defect the soak found: a consumer that skipped to a corrupt tail word ahead of ours stores it as head. The
    writer re-bases there (dropping and reporting one event) instead of treating the ring as full for good; a head
    more than a ring ahead, or misaligned, is still never trusted."""
    w = new_writer(ring_dir, native=native)
    c = Consumer(w.path)
    try:
        cap = w.stats()["capacity"]
        toks, hashes = list(range(64)), list(range(4))
        seq = 0
        while w.stats()["tail"] < cap // 2:  # half a ring, drained: the writer's cached head stays at 0
            seq += 1
            assert w.publish_stored(seq, toks, hashes, None, 0, None, False)
        c.drain()
        bad = w.stats()["tail"] + ahead
        c.q[0x100 // 8] = bad
        results = []
        for _ in range(2 * cap // 300):  # more than a ring's worth: the writer must look at the head
            seq += 1
            results.append(w.publish_stored(seq, toks, hashes, None, 0, None, False))
            if results[-1] and False in results:
                break
        if not rebased:
            assert w.stats()["tail"] <= cap and not results[-1], f"trusted head {bad}"
            return
        assert w.stats()["tail"] > bad, "the writer did not re-base at the consumer's head"
        assert results.count(False) == 1, "exactly the event that found the head is dropped"
        ring = read(w.path, head=bad)
        assert [r["type"] for r in ring.records[:2]] == [2, 1], "a LOSS record for the dropped event, then events"
        assert ring.records[0]["count"] == 1
    finally:
        c.close()
        w.close()


def test_loss_record_and_event_both_need_room(ring_dir: str, native: bool) -> None:
    """With a loss pending, the LOSS record and the event are published together or not at all."""
    w = new_writer(ring_dir, native=native)
    c = Consumer(w.path)
    try:
        big = list(range(1000))
        seq = 0
        while w.publish_removed(seq + 1, big, 0):
            seq += 1
        assert not w.publish_removed(seq + 1, big, 0)
        c.drain()
        while w.publish_cleared(seq + 2, 0):  # LOSS+Cleared fits once; then Cleared alone until full
            seq += 1
        ring = c.drain()
        assert ring.records[0]["type"] == 2 and all(r["type"] == 1 for r in ring.records[1:])
    finally:
        c.close()
        w.close()


def test_record_too_large_is_dropped(ring_dir: str) -> None:
    w = new_writer(ring_dir, max_record=256)
    c = Consumer(w.path)
    try:
        assert not w.publish_removed(1, list(range(40)), 0)
        st = w.stats()
        assert (st["dropped_events"], st["dropped_too_large"], st["loss_first_seq"]) == (1, 1, 1)
        assert w.publish_removed(2, [5], 0)
        ring = c.drain()
        assert [(r["type"], r.get("first_seq"), r.get("count")) for r in ring.records] == [(2, 1, 1), (1, None, None)]
    finally:
        c.close()
        w.close()


def test_invalid_event_changes_nothing(ring_dir: str) -> None:
    w = new_writer(ring_dir)
    try:
        assert w.publish_cleared(1, 0)
        before = w.stats()
        image = Path(w.path).read_bytes()
        for call, exc in (
            (lambda: w.publish_stored(2, [1 << 32], [1], None, 0, None, False), ValueError),
            (lambda: w.publish_stored(-2, [1], [1], None, 0, None, False), ValueError),
            (lambda: w.publish_stored(2, [1], [1], None, -1, None, False), ValueError),
            (lambda: w.publish_stored(2, [1], [1], 1 << 64, 0, None, False), ValueError),
            (lambda: w.publish_removed(2, ["x"], 0), TypeError),
            (lambda: w.publish_cleared(1 << 64, 0), ValueError),
        ):
            with pytest.raises(exc):
                call()
        assert w.stats() == before
        after = Path(w.path).read_bytes()
        assert after[:4096] == image[:4096], "header changed"
        assert parse(after).records == parse(image).records
        # Full ring: a bad seq is refused before the drop is counted.
        while w.publish_cleared(3, 0):
            pass
        full = w.stats()
        with pytest.raises(ValueError):
            w.publish_cleared(-1, 0)
        assert w.stats() == full
    finally:
        w.close()


def test_second_producer_refused(ring_dir: str) -> None:
    w = new_writer(ring_dir, name="r.ring")
    try:
        with pytest.raises(RingLockedError, match="locked"):
            new_writer(ring_dir, name="r.ring")
        fd = os.open(w.path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        w.close()
    with pytest.raises(FileExistsError):  # a stale file is not reused
        new_writer(ring_dir, name="r.ring")


def test_forked_child_refused(ring_dir: str) -> None:
    w = new_writer(ring_dir)
    try:
        assert w.publish_cleared(1, 0)
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                os.close(r)
                try:
                    w.publish_cleared(2, 0)
                except RingForkedError as e:
                    os.write(wfd, str(e).encode())
                    w.close()  # must not mark the parent's ring CLOSED
                    code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        msg = os.read(r, 4096).decode()
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "child was allowed to publish"
        assert "forked child" in msg
        assert read(w.path).header["state"] == 1, "child's close touched the header"
        assert w.publish_cleared(3, 0), "parent keeps publishing"
        assert [r["payload"] for r in read(w.path).records] == [_encode.encode_cleared(1), _encode.encode_cleared(3)]
    finally:
        w.close()


def test_refuses_an_unsafe_publication(ring_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off x86-64 only the C extension publishes: without it (native=False stands for a missing build) the writer
    refuses before it creates anything."""
    monkeypatch.setattr(_words.platform, "machine", lambda: "aarch64")
    with pytest.raises(RingPlatformError, match="x86-TSO"):
        new_writer(ring_dir, native=False)
    assert os.listdir(ring_dir) == []
    if _words.NATIVE is not None:
        w = new_writer(ring_dir)
        try:
            assert w.publish_cleared(1, 0)
        finally:
            w.close()
    monkeypatch.setattr(_words.sys, "byteorder", "big")
    with pytest.raises(RingPlatformError, match="little-endian"):
        new_writer(ring_dir)


def test_no_space_fails_at_creation(ring_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, off: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_ring.os, "posix_fallocate", full)
    with pytest.raises(RingSpaceError, match="no space"):
        new_writer(ring_dir)
    assert os.listdir(ring_dir) == [], "a failed creation leaves no file"


@pytest.mark.parametrize(
    ("kw", "exc"),
    [
        ({"capacity": (64 << 10) + 8}, ValueError),
        ({"capacity": 32 << 10}, ValueError),
        ({"capacity": 8 << 30}, ValueError),
        ({"kv_block_size": 0}, ValueError),
        ({"kv_block_size": 1 << 32}, ValueError),
        ({"worker_id": -1}, ValueError),
        ({"worker_id": "7"}, TypeError),
        ({"max_record": 24}, ValueError),
        ({"max_record": 1001}, ValueError),
        ({"max_record": (64 << 10) // 4}, ValueError),
        ({"mode": 0o4600}, ValueError),
    ],
)
def test_create_validates(ring_dir: str, kw: dict[str, Any], exc: type[Exception]) -> None:
    args: dict[str, Any] = {"worker_id": 1, "kv_block_size": 16, "max_buffer_size": 10, "capacity": 64 << 10}
    args.update(kw)
    with pytest.raises(exc, match="kvshm"):
        RingWriter.create(ring_dir, **args)
    assert os.listdir(ring_dir) == []


def test_constructor_is_private() -> None:
    with pytest.raises(TypeError):
        RingWriter()


def test_head_from_a_broken_consumer_is_not_trusted(ring_dir: str, native: bool) -> None:
    """A head no consumer can store (misaligned, more than a ring ahead) makes the ring look full: drops, never
    overwrites."""
    w = new_writer(ring_dir, native=native)
    c = Consumer(w.path)
    try:
        while w.publish_cleared(1, 0):
            pass
        c.q[0x100 // 8] = 12  # misaligned
        assert not w.publish_cleared(2, 0)
        c.q[0x100 // 8] = w.stats()["tail"] + 2 * w.stats()["capacity"]  # more than a ring ahead
        assert not w.publish_cleared(3, 0)
        assert w.stats()["dropped_events"] == 3
        # (A head ahead by at most a ring is a consumer that skipped to a corrupt tail word: the writer re-bases
        # there, see test_rebases_at_a_head_ahead_of_the_tail.)
    finally:
        c.close()
        w.close()


def test_proc_stat() -> None:
    """The one /proc/<pid>/stat parser: our state and start time (checked against an independent parse), None
    for a pid that does not exist."""
    st = _proc.proc_stat(os.getpid())
    assert st is not None
    raw = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/stat").read_bytes()  # the kernel's, also under qemu-user
    assert st == (raw[raw.rindex(b")") + 2 : raw.rindex(b")") + 3], int(raw[raw.rindex(b")") + 1 :].split()[19]))
    assert _proc.proc_stat() == st
    assert _proc.proc_stat(2**22 + 1) is None  # above pid_max's ceiling: never a process


def test_ring_error_is_a_kvshm_error() -> None:
    from kvshm import KvshmError, RingError

    assert issubclass(RingError, KvshmError)
    assert all(issubclass(e, RingError) for e in (_ring.RingPlatformError, _ring.RingLockedError,
                                                  _ring.RingSpaceError, _ring.RingForkedError, _ring.RingClosedError))
