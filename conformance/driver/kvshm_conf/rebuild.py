"""What a real consumer rebuilds from an answer: the reference consumer (deepinfra's, on Dynamo 1.6.1's tree).

A :class:`Follower` is one global indexer listening to some ``(worker_id, dp_rank)`` keys: live events go through
``Consumer.apply_live`` (stale seqs dropped, watermark advanced), recovery answers through
``Consumer.apply_recovery`` (Events and TreeDumps rewritten to the key, a TreeDump resets the key first). Its
:meth:`Follower.state` is the crate's canonical state JSON: equal strings mean every later match and every later
event resolves alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import kvshm_conformance as ref

from .ops import Event, op_json


class Follower:
    """A reference consumer for the keys of one worker; ``block_size`` hashes live tokens as the engine did."""

    def __init__(self, worker_id: int, block_size: int) -> None:
        self.worker_id = worker_id
        self.block_size = block_size
        self.consumer = ref.Consumer(block_size)

    def live(self, ev: Event, dp_rank: int | None = None) -> str:
        """Apply one live event as the listener of ``dp_rank`` (default: the event's own rank)."""
        r = ev.dp_rank if dp_rank is None else dp_rank
        return self.consumer.apply_live(self.worker_id, r, op_json(ev))

    def live_batch(self, dp_rank: int, seq: int, evs: Iterable[Event]) -> str:
        """Apply one live batch (events sharing ``seq``) as 1.6.1's ZMQ listener does: all or nothing (stale)."""
        return self.consumer.apply_live_batch(self.worker_id, dp_rank, seq, [op_json(ev) for ev in evs])

    def observe(self, dp_rank: int, seq: int) -> tuple[str, int | None]:
        """What the listener of ``dp_rank`` sees for a live ``seq`` (``initial``, ``contiguous``, ``gap``,
        ``stale``) and the first seq it expects (None before anything was seen)."""
        kind = self.consumer.observe(self.worker_id, dp_rank, seq)
        wm = self.consumer.watermark(self.worker_id, dp_rank)
        return kind, None if wm is None else wm + 1

    def recover(self, dp_rank: int, body: str) -> str:
        """Apply a ``/kv_recover`` body for ``dp_rank``; returns the variant."""
        return self.consumer.apply_recovery(self.worker_id, dp_rank, body)

    def watermark(self, dp_rank: int) -> int | None:
        return self.consumer.watermark(self.worker_id, dp_rank)

    def state(self) -> str:
        return self.consumer.state()

    def key_state(self, dp_rank: int) -> list[Any]:
        """The blocks of one ``(worker_id, dp_rank)`` in the canonical state (empty when the key holds none)."""
        return key_blocks(self.consumer.state(), self.worker_id, dp_rank)


def key_blocks(state: str, worker_id: int, dp_rank: int) -> list[Any]:
    for w in json.loads(state)["workers"]:
        if w["worker_id"] == worker_id and w["dp_rank"] == dp_rank:
            return list(w["blocks"])
    return []


def rank_of(router_event: dict[str, Any]) -> int:
    ev = router_event.get("event", {})
    return int(ev.get("dp_rank", 0))


def filter_rank(body: str, dp_rank: int) -> str:
    """The answer restricted to one rank's events (Dynamo 1.6.1's Cleared is per rank, so a Cleared of another
    rank is dropped too). Non-list variants are returned unchanged."""
    doc = json.loads(body)
    if isinstance(doc, dict) and len(doc) == 1:
        (variant, inner), = doc.items()
        if variant in ("Events", "TreeDump") and isinstance(inner, dict) and isinstance(inner.get("events"), list):
            inner["events"] = [e for e in inner["events"] if rank_of(e) == dp_rank]
            return json.dumps(doc, separators=(",", ":"))
    return body


def rebuild(
    worker_id: int,
    block_size: int,
    ranks: Iterable[int],
    prefix: Iterable[Event],
    body: str,
    *,
    split_ranks: bool = True,
) -> tuple[str, list[str], list[int | None]]:
    """A fresh consumer primed with ``prefix`` (live; a run of events sharing a seq and rank is one batch), then
    fed ``body`` per rank (each rank's share of the answer under its own key when ``split_ranks``). Returns the
    canonical state, the variants and the watermarks."""
    f = Follower(worker_id, block_size)
    ranks = list(ranks)
    run: list[Event] = []  # consecutive events sharing (seq, dp_rank): one batch, applied as 1.6.1's listener does
    for ev in prefix:
        if run and (run[0].seq, run[0].dp_rank) != (ev.seq, ev.dp_rank):
            f.live_batch(run[0].dp_rank, run[0].seq, run)
            run = []
        run.append(ev)
    if run:
        f.live_batch(run[0].dp_rank, run[0].seq, run)
    variants: list[str] = []
    marks: list[int | None] = []
    for r in ranks:
        variants.append(f.recover(r, filter_rank(body, r) if split_ranks else body))
        marks.append(f.watermark(r))
    return f.state(), variants, marks


def state_diff(ours: str, want: str, limit: int = 3) -> str:
    """A short description of how two canonical states differ: per key, the blocks only one side holds."""
    def keyed(state: str) -> dict[tuple[int, int], list[Any]]:
        return {(w["worker_id"], w["dp_rank"]): list(w["blocks"]) for w in json.loads(state)["workers"]}

    a, b = keyed(ours), keyed(want)
    parts: list[str] = []
    for key in sorted(set(a) | set(b)):
        xa, xb = a.get(key, []), b.get(key, [])
        only_a = [x for x in xa if x not in xb]
        only_b = [x for x in xb if x not in xa]
        if only_a or only_b:
            parts.append(
                f"{key}: {len(xa)} vs {len(xb)} blocks; only rebuilt {only_a[:limit]}; only expected {only_b[:limit]}"
            )
    return "; ".join(parts) or "equal"
