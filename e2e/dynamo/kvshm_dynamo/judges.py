"""What the run reads: each request's routing decision (the KV router's debug line) and what the engine really
had cached for it (vLLM's ``cached_tokens`` in the OpenAI usage), the events the router applied (its Prometheus
counter), and the batches on each worker's PUB."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvshm_e2e.judges import WireRecorder

from kvshm_testkit import http_get, http_post

from .model import word
from .stack import BLOCK_SIZE, MODEL_NAME

# dynamo_llm::kv_router::routing_host::kv_selection, DEBUG: one line per routing decision.
_BEST = re.compile(r"\[ROUTING\] Best: worker_(\d+) dp_rank=(\d+) with (\d+)/(\d+) blocks overlap")
_APPLIED = re.compile(r"^\S*kv_cache_events_applied(?:_total)?\{([^}]*)\}\s+(\S+)$", re.M)


@dataclass(frozen=True)
class Decision:
    """One request as the router routed it and as the chosen engine served it."""

    worker: int  # the worker's index (1, 2); 0: not found in the log
    overlap: int  # blocks the router believed the chosen worker holds
    cached: int  # full blocks the engine had cached for it (cached_tokens // block size); -1: the request failed
    # Each worker's overlap for the request just before it was sent (worker 1's, worker 2's), from the events its
    # PUB had carried (CacheView): what the router weighed; -1 for a worker that was down. Not part of the decision
    # (two decisions are the same when worker, overlap and cached are).
    overlaps: tuple[int, ...] = field(default=(), compare=False)

    @property
    def tie(self) -> bool:
        """Both workers up with the same overlap: the router's pick between them is its coin (router_temperature
        0: uniform among the tied), whatever the publisher."""
        return len(self.overlaps) == 2 and self.overlaps[0] == self.overlaps[1] >= 0

    @property
    def right(self) -> bool:
        """The router's belief about the chosen worker is what the engine had."""
        return self.cached >= 0 and self.overlap == self.cached

    def cell(self) -> str:
        return f"w{self.worker}:{self.overlap}/{self.cached}" + ("=" if self.tie else "")


class Client:
    """Sends completions to the frontend, one at a time, and reads each one's routing decision from the log."""

    def __init__(self, url: str, log: Path, ids: dict[int, int]) -> None:
        self.url = url
        self.log = log
        self.ids = ids  # Dynamo instance id -> worker index (every incarnation's)
        self._offset = log.stat().st_size if log.exists() else 0

    def complete(self, tokens: list[int], timeout: float = 60.0, overlaps: tuple[int, ...] = ()) -> Decision:
        body = {"model": MODEL_NAME, "prompt": " ".join(word(t) for t in tokens), "max_tokens": 2,
                "temperature": 0.0}
        r = http_post(self.url + "/v1/completions", json.dumps(body).encode(), timeout=timeout)
        cached = -1
        if r.ok:
            usage: dict[str, Any] = r.json().get("usage") or {}
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) // BLOCK_SIZE
        worker, overlap = self._decision()
        return Decision(worker, overlap, cached, overlaps)

    def _decision(self) -> tuple[int, int]:
        """The routing line(s) logged since the last request: the last one (a request is routed once)."""
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            text = f.read().decode(errors="replace")
            self._offset = f.tell()
        return last_decision(text, self.ids)


def last_decision(log_text: str, ids: dict[int, int]) -> tuple[int, int]:
    """The last routing decision in ``log_text``: (worker index by ``ids``, 0 for an unknown id; overlap blocks);
    (0, -1) when there is none."""
    found = _BEST.findall(log_text)
    if not found:
        return 0, -1
    wid, _, overlap, _ = found[-1]
    return ids.get(int(wid), 0), int(overlap)


def events_applied(frontend_url: str) -> dict[str, int]:
    """The router's applied-event counter by status (``ok``, ...), summed over event types; {} when it has none
    (or the frontend is down)."""
    r = http_get(frontend_url + "/metrics", 5.0)
    return parse_applied(r.text) if r.ok else {}


def parse_applied(text: str, by: str = "status", status: str | None = None) -> dict[str, int]:
    """The applied-event counter of a Prometheus text exposition, by the label ``by`` (``status``, ``event_type``),
    summed over its other labels; with ``status``, only the series of that status."""
    out: dict[str, int] = {}
    for labels, value in _APPLIED.findall(text):
        if status is not None and f'status="{status}"' not in labels:
            continue
        m = re.search(by + r'="([^"]*)"', labels)
        key = m.group(1) if m else "?"
        out[key] = out.get(key, 0) + int(float(value))
    return out


@dataclass
class BatchCount:
    """The batches one worker's PUB carried, by what they held."""

    engine: int = 0  # batches with an event other than a lone AllBlocksCleared
    events: int = 0  # events in those
    # The events in those as dynamo.vllm's relay hands them on: adjacent events of one kind within a batch merged
    # into one (its batching step coalesces adjacent stores and adjacent removals: an eviction's BlockRemoved pair is
    # one router event).
    merged: int = 0
    cleared: int = 0  # [AllBlocksCleared] alone (kvshmd's incarnation batches; vLLM sends none on its own here)
    empty: int = 0  # no events (kvshmd's heartbeats)

    @property
    def total(self) -> int:
        return self.engine + self.cleared + self.empty


class CacheView:
    """A worker's cache as the events on its PUB describe it (what a router fed by them holds for the worker):
    each stored block keyed by the tokens from the prompt's start through its end (a block's hash is its parent's
    and its own tokens'), so a prompt's overlap is read without the engine's hash function. Thread-safe (the
    recorder's thread applies, the run reads)."""

    def __init__(self, block_size: int = BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._lock = threading.Lock()
        self._key: dict[Hashable, tuple[int, ...]] = {}  # every hash seen -> its tokens from the start
        self._cached: dict[tuple[int, ...], Hashable] = {}  # the blocks held now: tokens from the start -> hash

    def clear(self) -> None:
        with self._lock:
            self._key.clear()
            self._cached.clear()

    def apply(self, ev: Any) -> None:
        """One decoded event (vLLM's BlockStored, BlockRemoved, AllBlocksCleared; a dict or vLLM's array form)."""
        tag = _tag(ev)
        with self._lock:
            if tag == "AllBlocksCleared":
                self._cached.clear()
            elif tag == "BlockStored":
                hashes, parent, tokens = _fields(ev, ("block_hashes", "parent_block_hash", "token_ids"))
                tokens = list(tokens or [])
                # A parent never seen (stored before the recorder connected) keys its children under nothing a
                # prompt can match: a block whose prefix is unknown counts as no overlap.
                prefix = () if parent is None else self._key.get(_hashable(parent), (-1,))
                for i, h in enumerate(hashes or []):
                    prefix = prefix + tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
                    self._key[_hashable(h)] = prefix
                    self._cached[prefix] = _hashable(h)
            elif tag == "BlockRemoved":
                (hashes,) = _fields(ev, ("block_hashes",))
                for h in hashes or []:
                    key = self._key.get(_hashable(h))
                    if key is not None and self._cached.get(key) == _hashable(h):
                        del self._cached[key]

    def overlap(self, tokens: Sequence[int]) -> int:
        """The prompt's leading full blocks this worker holds."""
        n = 0
        with self._lock:
            while (n + 1) * self.block_size <= len(tokens) and \
                    tuple(tokens[:(n + 1) * self.block_size]) in self._cached:
                n += 1
        return n


_ARRAY_FIELDS = {"block_hashes": 1, "parent_block_hash": 2, "token_ids": 3}


def _fields(ev: Any, names: tuple[str, ...]) -> list[Any]:
    if isinstance(ev, dict):
        return [ev.get(n) for n in names]
    return [ev[_ARRAY_FIELDS[n]] if len(ev) > _ARRAY_FIELDS[n] else None for n in names]


def _hashable(h: Any) -> Hashable:
    return tuple(h) if isinstance(h, list) else h


class BatchRecorder(WireRecorder):
    """kvshm_e2e's WireRecorder (every seq, labelled by incarnation) that also classifies each batch and keeps the
    worker's cache as its events describe it (:attr:`view`; a new incarnation starts it empty, as the router's
    index of a restarted worker's new instance does)."""

    def __init__(self, endpoint: str) -> None:
        self.count = BatchCount()
        self.view = CacheView()
        self.sizes: list[int] = []  # events per engine batch, in order (the engine's batch boundaries)
        super().__init__(endpoint)

    def on_payload(self, payload: bytes) -> None:
        import msgspec

        try:
            _, events, _ = msgspec.msgpack.decode(payload)
        except (msgspec.DecodeError, ValueError, TypeError):
            return
        if not events:
            self.count.empty += 1
        elif len(events) == 1 and _tag(events[0]) == "AllBlocksCleared":
            self.count.cleared += 1
        else:
            self.count.engine += 1
            self.count.events += len(events)
            tags = [_tag(e) for e in events]
            self.count.merged += sum(1 for i, t in enumerate(tags) if i == 0 or t != tags[i - 1])
            self.sizes.append(len(events))
        for ev in events:
            self.view.apply(ev)

    def incarnation(self, label: str) -> None:
        super().incarnation(label)
        self.view.clear()


def _tag(ev: Any) -> str:
    if isinstance(ev, dict):
        return str(ev.get("type", ""))
    return str(ev[0]) if isinstance(ev, list) and ev else ""
