"""Helpers for the kvshm tests: they look at the ring file and the daemon from the outside (never through the code
under test), and run a shared kvshmd as an operator would."""

from __future__ import annotations

import json
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvshm import LocalIndexer
from kvshm._client import Client, ClientError
from kvshm._launcher import find_kvshmd
from kvshm._ring import proc_stat

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO / "testdata"
OFF_TAIL = 0x80  # ring header: the producer's commit word (shm/FORMAT.md)

def ring_tail(ix: LocalIndexer) -> int:
    """The tail word of the indexer's ring, read from the file (not through the writer)."""
    with open(ix.stats()["ring_path"], "rb") as f:
        header = f.read(OFF_TAIL + 8)
    tail: int = struct.unpack_from("<Q", header, OFF_TAIL)[0]
    return tail


def query(ix: LocalIndexer, start: int | None = None, end: int | None = None) -> Any:
    """get_events_json parsed; its single top-level key is the WorkerKvQueryResponse variant."""
    value = json.loads(ix.get_events_json(start, end))
    assert isinstance(value, dict) and len(value) == 1, value
    return value


def variant(resp: Any) -> str:
    (name,) = resp
    return str(name)


def event_ids(resp: Any) -> list[int]:
    (body,) = resp.values()
    return [int(e["event"]["event_id"]) for e in body["events"]]


def daemon_stream(socket_path: str, worker_id: int) -> dict[str, Any]:
    """The daemon's STATS entry for ``worker_id``."""
    with Client(socket_path, timeout=10) as c:
        (stream,) = c.stats(worker_id)["streams"]
    assert isinstance(stream, dict)
    return stream


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Polls ``cond`` until true; fails after ``timeout`` (a liveness bound, not a performance assertion)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie waiting for a reaper that is not us)."""
    st = proc_stat(pid)
    return st is None or st[0] in (b"Z", b"X")


@dataclass
class SharedDaemon:
    """A kvshmd started by the test, as an operator would run a shared one."""

    socket_path: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [find_kvshmd(), "serve", "--socket", self.socket_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while True:
            assert self.proc.poll() is None, f"kvshmd exited: {self.log_path.read_text()}"
            try:
                with Client(self.socket_path, timeout=2) as c:
                    if c.health()["status"] == "ok":
                        return
            except ClientError:
                pass
            assert time.monotonic() < deadline, f"kvshmd not ready: {self.log_path.read_text()}"
            time.sleep(0.01)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def toks(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))
