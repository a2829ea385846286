"""vLLM's KV-event wire shapes (0.33.0; 0.32.0 through ``wire="0.32"``) for the tests that compare kvshmd's ZMQ
stream with what vLLM would send (the msgspec Structs live in testdata/vllmwire/vllm_structs.py, their one home),
and pyzmq helpers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from kvshm import LocalIndexer
from kvshm import events as ke

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testdata" / "vllmwire"))
from vllm_structs import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, payload  # noqa: E402

__all__ = [
    "AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "join", "sub_socket", "vllm_payload", "warm_up",
]


def vllm_payload(ts: float, events: list[Any], dp: int, wire: str = "0.33") -> bytes:
    """What vLLM of release ``wire`` sends for the batch (its msgspec structs)."""
    return payload(ts, events, dp, wire)


def sub_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    return s


def warm_up(publish: Callable[[int], object], sub: zmq.Socket[bytes], start: int = 0) -> tuple[int, int]:
    """Calls ``publish(seq)`` for seq = start, start+1, ... until the subscriber receives a batch (PUB drops what it
    sends before the subscription arrives), then drains the warm-ups still in flight. Returns the seq of the first
    batch received and the next free seq."""
    seq = start
    sub.setsockopt(zmq.RCVTIMEO, 100)
    while True:
        publish(seq)
        seq += 1
        try:
            frames = sub.recv_multipart()
        except zmq.Again:
            assert seq - start < 300, "the subscriber never received a batch"
            continue
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        first = last = int.from_bytes(frames[1], "big")
        while last != seq - 1:
            last = int.from_bytes(sub.recv_multipart()[1], "big")
        return first, seq


def join(ix: LocalIndexer, sub: zmq.Socket[bytes], start: int = 0) -> int:
    """:func:`warm_up` with one-event Cleared batches through ``ix.apply_batch``; returns the next free seq."""
    return warm_up(lambda seq: ix.apply_batch(seq, [ke.AllBlocksCleared()], ts=1.0), sub, start)[1]
