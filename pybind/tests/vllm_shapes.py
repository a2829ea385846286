"""vLLM 0.33.0's KV-event wire shapes for the tests that compare kvshmd's ZMQ stream with what vLLM would send (the
msgspec Structs live in testdata/vllmwire/vllm_structs.py, their one home), and pyzmq helpers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import zmq

from kvshm import LocalIndexer
from kvshm import events as ke

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testdata" / "vllmwire"))
from vllm_structs import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, payload  # noqa: E402

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "join", "sub_socket", "vllm_payload"]


def vllm_payload(ts: float, events: list[Any], dp: int) -> bytes:
    return payload(ts, events, dp)


def sub_socket(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    return s


def join(ix: LocalIndexer, sub: zmq.Socket[bytes]) -> int:
    """Publishes one-event warm-up batches until the subscriber receives one (PUB drops what it sends before the
    subscription arrives); returns the next free seq."""
    seq = 0
    sub.setsockopt(zmq.RCVTIMEO, 100)
    while True:
        ix.apply_batch(seq, [ke.AllBlocksCleared()], ts=1.0)
        seq += 1
        try:
            frames = sub.recv_multipart()
        except zmq.Again:
            assert seq < 300, "the subscriber never received a batch"
            continue
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        last = int.from_bytes(frames[1], "big")
        while last != seq - 1:  # drain the warm-ups still in flight
            last = int.from_bytes(sub.recv_multipart()[1], "big")
        return seq
