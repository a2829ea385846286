"""Helpers for the kvshm tests: they look at the ring file and the daemon from the outside (never through the code
under test), and run a shared kvshmd as an operator would."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvshm import LocalIndexer
from kvshm._client import Client
from kvshm._launcher import find_kvshmd
from kvshm._ring import proc_stat
from kvshm_testkit import Kvshmd, Response
from kvshm_testkit import http_get as kit_http_get

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


def dump_blocks(resp: Any) -> set[tuple[int, int | None, int, int]]:
    """What a consumer rebuilds from a TreeDump, as (dp_rank, parent_hash, block_hash, tokens_hash), whatever the
    dump's shape: Dynamo 1.6.1's merged chains (a Stored event's blocks chain under its parent_hash, each the
    parent of the next) or one block per event."""
    got = set()
    for e in resp["TreeDump"]["events"]:
        stored = e["event"]["data"]["stored"]
        parent = stored["parent_hash"]
        for blk in stored["blocks"]:
            got.add((e["event"]["dp_rank"], parent, blk["block_hash"], blk["tokens_hash"]))
            parent = blk["block_hash"]
    return got


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


class SharedDaemon(Kvshmd):
    """A kvshmd started by the test, as an operator would run a shared one: kvshm_testkit's ``Kvshmd`` (healthy
    when HEALTH answers on the socket, within 20 s; ``args`` are more ``kvshmd serve`` flags: --http ADDR,
    --rank-ports BASE, ...)."""

    def __init__(self, socket_path: str, log_path: Path, args: tuple[str, ...] = ()) -> None:
        super().__init__(find_kvshmd(), Path(socket_path).parent, http=None, flags=args, socket=Path(socket_path),
                         log=log_path, runtime_dir=False)
        self.socket_path = socket_path


def http_get(port: int, path: str) -> Response:
    """GET http://127.0.0.1:port/path as the global indexer does (any status returned, never raised)."""
    return kit_http_get(f"http://127.0.0.1:{port}{path}", 30.0)


def toks(lo: int, n: int) -> list[int]:
    return list(range(lo, lo + n))
