"""vLLM's KV-event wire shapes (0.33.0; 0.32.0 through ``wire="0.32"``) for the tests that compare kvshmd's ZMQ
stream with what vLLM would send (the msgspec Structs live in testdata/vllmwire/vllm_structs.py, their one home),
and pyzmq helpers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq

from kvshm import LocalIndexer
from kvshm import events as ke

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testdata" / "vllmwire"))
from vllm_structs import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, payload  # noqa: E402

__all__ = [
    "AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "decode", "first_id", "is_heartbeat", "join",
    "recv_batch", "sub_socket", "vllm_payload", "warm_up",
]


def vllm_payload(ts: float, events: list[Any], dp: int, wire: str = "0.33") -> bytes:
    """What vLLM of release ``wire`` sends for the batch (its msgspec structs)."""
    return payload(ts, events, dp, wire)


def first_id(ix: LocalIndexer) -> int:
    """The first id the daemon's index holds for ``ix``'s stream (on a publishing stream, the wire seq of its
    incarnation's start Cleared)."""
    stream = ix.stats()["daemon_stream"]
    assert stream is not None, "the daemon knows the stream"
    first: int = stream["first_event_id"]
    return first


def sub_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    return s


def decode(payload: bytes) -> tuple[float, list[Any], int | None]:
    """A batch's payload as vLLM's ``[ts, events, data_parallel_rank]`` (events as msgpack maps or arrays)."""
    ts, events, dp = msgspec.msgpack.decode(payload)
    return ts, events, dp


def is_heartbeat(payload: bytes) -> bool:
    """kvshmd's heartbeat on an idle publishing stream: a batch with no events (docs/lifecycle.md, "Heartbeats"); an
    engine's empty batch is never published, so an empty one on the wire is always kvshmd's."""
    return decode(payload)[1] == []


def recv_batch(sub: zmq.Socket[bytes], after: int = -1) -> tuple[bytes, int, bytes]:
    """The next non-heartbeat message ``(topic, wire seq, payload)``; every seq, heartbeats' too, must be above
    ``after`` and above the one before (wire seqs strictly increase). More than 30 heartbeats in a row (30 s of an
    idle stream at the default interval) while a batch is awaited fail."""
    for _ in range(31):
        topic, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        assert seq > after, f"wire seq {seq} after {after}: not strictly increasing"
        after = seq
        if not is_heartbeat(payload):
            return topic, seq, payload
    raise AssertionError(f"only heartbeats since wire seq {after}: the batch never came")


WARM_TS = 0.25  # the warm-up batches' ts
MARK_TS = 0.75  # the last warm-up's ts: its arrival ends the warm-up


def warm_up(publish: Callable[[int, float], object], sub: zmq.Socket[bytes], start: int = 0) -> tuple[int, int]:
    """Calls ``publish(seq, ts)`` for engine seq = start, start+1, ... with ts = WARM_TS until the subscriber
    receives a batch (PUB drops what it sends before the subscription arrives), then once more with ts = MARK_TS and
    drains the warm-ups still in flight up to that one. The wire seqs are kvshmd's (docs/lifecycle.md): they must
    strictly increase, heartbeats are skipped and the incarnation's start Cleared may come first. Returns the mark's
    wire seq and the next free engine seq."""
    seq = start
    sub.setsockopt(zmq.RCVTIMEO, 100)
    try:
        while True:
            publish(seq, WARM_TS)
            seq += 1
            try:
                _, last, _ = recv_batch(sub)
                break
            except zmq.Again:
                assert seq - start < 300, "the subscriber never received a batch"
    finally:
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
    publish(seq, MARK_TS)
    seq += 1
    for _ in range(seq - start + 1):  # at most every warm-up and the incarnation's start Cleared before the mark
        _, last, payload = recv_batch(sub, last)
        if decode(payload)[0] == MARK_TS:
            return last, seq
    raise AssertionError("the warm-up's mark never arrived")


def join(ix: LocalIndexer, sub: zmq.Socket[bytes], start: int = 0) -> tuple[int, int]:
    """:func:`warm_up` with one-event Cleared batches through ``ix.apply_batch``; returns the mark's wire seq and the
    next free engine seq."""
    return warm_up(lambda seq, ts: ix.apply_batch(seq, [ke.AllBlocksCleared()], ts=ts), sub, start)
