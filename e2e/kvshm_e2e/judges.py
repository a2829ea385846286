"""The judges: Dynamo 1.6.1's standalone indexer (the router), kvshmd's own ``/kv_recover``, and a SUB that records
every seq on the wire."""

from __future__ import annotations

import json
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from kvshm_testkit import Proc, http_get, http_post, wait_until

from .truth import key

MODEL_NAME = "e2e"


@dataclass(frozen=True)
class State:
    """A judge's view of one worker: its block hashes, or why there is none."""

    hashes: frozenset[int]
    note: str = ""  # "down" (nothing answers), "incomplete" (kvshmd's Kvshm-State), an error


class Router:
    """``conformance``'s ``standalone`` binary (Dynamo 1.6.1's ``run_server``), restarted as a new process: its
    registrations and state die with it, so :meth:`start` registers the worker again."""

    def __init__(self, binary: Path, port: int, log: Path) -> None:
        self.binary = binary
        self.port = port
        self.log = log
        self.proc: Proc | None = None
        self.starts = 0
        self._log_offset = 0

    def warnings(self) -> list[str]:
        """The router's WARN/ERROR lines since the last call (gaps, incomplete replays), each once, shortened."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
                self._log_offset = f.tell()
        except FileNotFoundError:
            return []
        seen: dict[str, None] = {}
        for line in text.splitlines():
            if line.startswith(("WARN ", "ERROR ")):
                # Up to the structured fields tracing appends (" worker_id=7", " self.worker_id=7", ...).
                seen.setdefault(re.split(r" (?:self\.)?worker_id=", line)[0][:200], None)
        return list(seen)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = Proc("router", [str(self.binary), "--port", str(self.port)], self.log)
        self.starts += 1
        wait_until("router /health", lambda: http_get(self.url + "/health", 1.0).status == 200, 20.0)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL, 10.0, group=True)
            self.proc = None

    def register(self, worker_id: int, endpoint: str, replay_endpoint: str, block_size: int) -> None:
        body = {"instance_id": worker_id, "endpoint": endpoint, "replay_endpoint": replay_endpoint,
                "model_name": MODEL_NAME, "block_size": block_size, "dp_rank": 0}
        r = http_post(self.url + "/register", json.dumps(body).encode())
        if not r.ok:
            raise RuntimeError(f"router /register: {r.status} {(r.text or r.error)[:300]!r}")

    def state(self, worker_id: int) -> State:
        r = http_get(self.url + "/dump")
        if r.status != 200:
            return State(frozenset(), f"/dump {r.status or 'down'}")
        doc: dict[str, Any] = r.json()
        hashes: set[int] = set()
        for entry in doc.values():
            for ev in entry.get("events", []):
                if ev.get("worker_id") != worker_id:
                    continue
                _apply(hashes, ev["event"]["data"])
        return State(frozenset(hashes))


def _apply(hashes: set[int], data: Any) -> None:
    """Applies one Dynamo ``KvCacheEventData`` (serde's externally tagged enum, snake_case) to a set of hashes."""
    if not isinstance(data, dict):
        if data == "cleared":
            hashes.clear()
        return
    if "stored" in data:
        for b in data["stored"]["blocks"]:
            hashes.add(key(int(b["block_hash"])))
    elif "removed" in data:
        for h in data["removed"]["block_hashes"]:
            hashes.discard(key(int(h)))
    elif "cleared" in data:
        hashes.clear()


class KvshmdJudge:
    """kvshmd's HTTP ``/kv_recover?start=0`` for one worker: the events (or tree dump) applied in order."""

    def __init__(self, http: str) -> None:
        self.http = http

    def state(self, worker_id: int) -> State:
        r = http_get(f"http://{self.http}/workers/{worker_id}/kv_recover?start=0", 5.0)
        if r.status == 0:
            return State(frozenset(), "down")
        if r.status != 200:
            return State(frozenset(), f"{r.status}")
        doc = r.json()
        hashes: set[int] = set()
        # Dynamo's WorkerKvQueryResponse: {"Events": {"events": [...], ...}} or {"TreeDump": {"events": [...]}}.
        variant = next((doc[k] for k in ("Events", "TreeDump") if isinstance(doc, dict) and k in doc), None)
        if isinstance(variant, dict):
            events = variant.get("events", [])
        else:
            return State(frozenset(), f"answer {str(doc)[:60]}")
        for ev in events:
            _apply(hashes, ev["event"]["data"])
        note = "incomplete" if r.headers.get("kvshm-state", "") == "incomplete" else ""
        return State(frozenset(hashes), note)


@dataclass
class WireRecord:
    """Every (incarnation, seq) a SUB saw on one PUB endpoint. An incarnation is a label the scenario sets when
    a publisher process (engine or kvshmd) starts: no seq may come back that an earlier incarnation already used."""

    seqs: list[tuple[str, int]] = field(default_factory=list)

    def reused(self) -> list[str]:
        """A description of every seq at or below one an earlier incarnation published (what Dynamo's listener,
        whose watermark never resets, drops as stale)."""
        out: list[str] = []
        high = -1  # the highest seq of the incarnations before the current one
        cur_label = ""
        cur_high = -1
        for label, seq in self.seqs:
            if label != cur_label:
                high = max(high, cur_high)
                cur_label, cur_high = label, -1
            if seq <= high:
                out.append(f"{label}: seq {seq} <= {high}")
            cur_high = max(cur_high, seq)
        return out


class WireRecorder:
    """A SUB on one PUB endpoint (connects before the publisher binds: libzmq reconnects), recording each batch's
    seq under the current incarnation label."""

    def __init__(self, endpoint: str) -> None:
        self.record = WireRecord()
        self.label = "start"
        self._stop = threading.Event()
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 200)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def incarnation(self, label: str) -> None:
        with self._lock:
            self.label = label

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frames = self._sock.recv_multipart()
            except zmq.Again:
                continue
            if len(frames) != 3 or len(frames[1]) != 8:
                continue
            with self._lock:
                self.record.seqs.append((self.label, int.from_bytes(frames[1], "big")))
                self.on_payload(frames[2])

    def on_payload(self, payload: bytes) -> None:
        """Each batch's payload, on the recorder's thread (a subclass reads more than the seq)."""

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._sock.close()
