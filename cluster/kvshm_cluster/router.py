"""Dynamo 1.6.1's standalone indexer as a router of the cluster: started in its own namespace, workers registered
over HTTP (``POST /register`` with ``endpoint`` and ``replay_endpoint``, one per ``(worker, dp_rank)``), its state
read from ``GET /dump`` (the router's tree as Dynamo's events, each with ``worker_id`` and ``dp_rank``)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from .procs import Proc, http_get, http_post, wait_until

MODEL = "cluster"
Key = tuple[int, int]  # (worker_id, dp_rank)


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
    def __init__(self, index: int, binary: Path, argv_prefix: list[str], ip: str, port: int, log: Path) -> None:
        self.index = index
        self.binary = binary
        self.prefix = argv_prefix
        self.url = f"http://{ip}:{port}"
        self.port = port
        self.log = log
        self.proc: Proc | None = None
        self.starts = 0

    def start(self) -> None:
        self.proc = Proc(f"router {self.index}", [*self.prefix, str(self.binary), "--port", str(self.port)],
                         self.log)
        self.starts += 1
        wait_until(f"router {self.index} /health", lambda: http_get(self.url + "/health", 1.0)[0] == 200, 30.0)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            self.proc.signal(sig)

    def register(self, worker: int, rank: int, endpoint: str, replay: str, block_size: int) -> None:
        body = {"instance_id": worker, "endpoint": endpoint, "replay_endpoint": replay, "model_name": MODEL,
                "block_size": block_size, "dp_rank": rank}
        status, text = http_post(self.url + "/register", json.dumps(body).encode())
        if status // 100 != 2:
            raise RuntimeError(f"router {self.index} /register: {status} {text[:300]!r}")

    def state(self, timeout: float = 30.0) -> tuple[dict[Key, set[int]] | None, int, float]:
        """(state or None when /dump fails, body bytes, seconds the dump took)."""
        t0 = time.monotonic()
        status, body = http_get(self.url + "/dump", timeout)
        dt = time.monotonic() - t0
        if status != 200:
            return None, 0, dt
        return dump_state(json.loads(body)), len(body), dt
