"""The cluster's routers, each started in its own namespace, workers registered over HTTP (``POST /register`` with
``endpoint`` and ``replay_endpoint``, one per ``(worker, dp_rank)``), its state read from ``GET /dump`` (Dynamo's
events, each with ``worker_id`` and ``dp_rank``). Two kinds speak these routes:

* ``dynamo``: Dynamo 1.6.1's standalone indexer (the conformance crate's ``standalone``): its tree as events;
* ``llmd``: llm-d-router's kvevents pool and in-memory index at ebab687927f5 (``cluster/llmd``, build/llmd-router):
  per pod ``W-R`` one Stored of the engine hashes whose request keys llm-d's index holds (cluster/llmd/doc.go). It
  gets the replay endpoint (llm-d's replay consumer: from seq 0 on connect, from lastSeq+1 on a gap, strict) and
  files blocks under the registered pod; its producers publish with :func:`llmd_topic`.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from kvshm_testkit import Proc, http_get, http_post, wait_until

MODEL = "cluster"
Key = tuple[int, int]  # (worker_id, dp_rank)
KINDS = ("dynamo", "llmd")


def llmd_topic(worker: int, rank: int) -> str:
    """The ZMQ topic of an llm-d cluster's producers, ``kv@<pod>@<model>`` with pod ``W-R``: ``kv@`` passes llm-d's
    subscription filter and the model enters its request keys (the pod is the registered one)."""
    return f"kv@{worker}-{rank}@{MODEL}"


def dump_state(doc: Any) -> dict[Key, set[int]]:
    """Every ``(worker, dp_rank)``'s block hashes in a ``/dump`` answer (events applied in order)."""
    out: dict[Key, set[int]] = {}
    entries = doc.values() if isinstance(doc, dict) else []
    for entry in entries:
        for ev in entry.get("events", []) if isinstance(entry, dict) else []:
            event = ev.get("event", {})
            key = (int(ev.get("worker_id", -1)), int(event.get("dp_rank", 0) or 0))
            hashes = out.setdefault(key, set())
            data = event.get("data")
            if data == "cleared" or (isinstance(data, dict) and "cleared" in data):
                hashes.clear()
            elif isinstance(data, dict) and "stored" in data:
                hashes.update(int(b["block_hash"]) for b in data["stored"]["blocks"])
            elif isinstance(data, dict) and "removed" in data:
                hashes.difference_update(int(h) for h in data["removed"]["block_hashes"])
    return out


class Router:
    """One router process; ``index`` counts within its ``kind`` (router 1 of each kind is the one faulted),
    ``ns_index`` is its namespace's."""

    def __init__(self, index: int, binary: Path, argv_prefix: list[str], ip: str, port: int, log: Path,
                 kind: str = "dynamo", ns_index: int | None = None) -> None:
        self.index = index
        self.kind = kind
        self.ns_index = index if ns_index is None else ns_index
        self.binary = binary
        self.prefix = argv_prefix
        self.url = f"http://{ip}:{port}"
        self.port = port
        self.log = log
        self.proc: Proc | None = None
        self.starts = 0

    def start(self) -> None:
        self.proc = Proc(f"{self.kind} router {self.index}", [*self.prefix, str(self.binary), "--port", str(self.port)],
                         self.log)
        self.starts += 1
        wait_until(f"{self.kind} router {self.index} /health",
                   lambda: http_get(self.url + "/health", 1.0).status == 200, 30.0)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            self.proc.send(sig, group=True)

    def register(self, worker: int, rank: int, endpoint: str, replay: str, block_size: int) -> None:
        body = {"instance_id": worker, "endpoint": endpoint, "replay_endpoint": replay, "model_name": MODEL,
                "block_size": block_size, "dp_rank": rank}
        r = http_post(self.url + "/register", json.dumps(body).encode())
        if not r.ok:
            raise RuntimeError(f"{self.kind} router {self.index} /register: {r.status} {(r.text or r.error)[:300]!r}")

    def state(self, timeout: float = 30.0) -> tuple[dict[Key, set[int]] | None, int, float]:
        """(state or None when /dump fails, body bytes, seconds the dump took)."""
        t0 = time.monotonic()
        r = http_get(self.url + "/dump", timeout)
        dt = time.monotonic() - t0
        if r.status != 200:
            return None, 0, dt
        return dump_state(r.json()), len(r.body), dt
