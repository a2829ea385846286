"""A drop-in for TensorRT-LLM's ``tensorrt_llm/serve/kv_zmq_publisher.py`` (``KvZmqPublisher``, the "read-only ZMQ
tee" of the deepinfra fork) that publishes through kvshmd.

TensorRT-LLM's tee translates the engine's native KV-cache events (the dicts of ``KVCacheEventSerializer``) into
vLLM's ZMQ wire format on a consumer thread: msgpack encode, PUB send, a replay ring and ROUTER socket in the
engine process. This class keeps its constructor, ``enqueue``/``handle``/``shutdown`` and its translation rules
(window-size filtering of the initial "created" events, partial blocks neither stored nor removed, the attention-DP
rank passed through, one event per batch, a seq per published event from 0), and hands each translated event to
one :class:`kvshm.LocalIndexer` for the worker (all attention-DP ranks) with ``publish=``: kvshmd publishes the
vLLM wire (PUB, replay ROUTER) and answers Dynamo's ``/kv_recover`` from the same events. The engine pays one ring
write per event; no thread, no queue, no socket in the engine process.

Use: replace ``from tensorrt_llm.serve.kv_zmq_publisher import KvZmqPublisher`` with
``from kvshm.integrations.trtllm import KvZmqPublisher`` (same arguments). ``KVSHM_WORKER_ID`` (default 0) is the
worker id of the recovery answers; the other ``LocalIndexer`` variables apply (``KVSHM_SOCKET``, ...).

Differences, on purpose: ``enqueue`` translates and publishes at once (kvshm's write never blocks, so no hand-off
queue is needed; ``queue_dropped`` stays 0 and ``queue_maxsize`` is accepted and unused); ``dropped`` counts
events kvshm dropped (ring full, counted as losses by the daemon) instead of PUB sends past the HWM (kvshmd counts
those, ``stats()["zmq"]``); hashes go on the wire as u64 (kvshm's rule; Dynamo reads both); events carry vLLM's
full ``BlockStored`` fields (medium "GPU", block_size) instead of the tee's reduced dicts; the multimodal
``block_mm_infos`` of the tee are not carried (kvshm's ring has no field for them yet). Exceptions from
translation are logged and the event dropped, as the tee does.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from .. import LocalIndexer, ZmqPublish
from .. import events as ke

__all__ = ["KvZmqPublisher"]

log = logging.getLogger("kvshm.trtllm")

_U64 = 1 << 64


class KvZmqPublisher:
    """TensorRT-LLM's KV-event ZMQ tee, published by kvshmd (see the module documentation)."""

    END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay end marker kvshmd sends (vLLM's)

    def __init__(
        self,
        zmq_endpoint: str,
        kv_block_size: int,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10000,
        queue_maxsize: int = 100000,
        sndhwm: int = 100000,
        topic: str = "",
    ) -> None:
        self.zmq_endpoint = zmq_endpoint
        self.kv_block_size = kv_block_size
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.sequence = 0
        self.dropped = 0
        self.queue_dropped = 0
        self.errors = 0
        self.partial_block_hashes: set[int] = set()
        self.max_window_size: int | None = None
        self.processing_initial_created_events = True
        self._last_engine_event_id: int | None = None
        worker = os.environ.get("KVSHM_WORKER_ID", "0").strip() or "0"
        if not worker.isdigit():
            raise ValueError(f"kvshm: KVSHM_WORKER_ID={worker!r} is not a non-negative integer")
        self.indexer = LocalIndexer(
            int(worker),
            kv_block_size,
            publish=ZmqPublish(
                endpoint=zmq_endpoint, replay_endpoint=replay_endpoint, topic=topic, hwm=sndhwm,
                buffer_steps=buffer_steps,
            ),
        )
        log.info("kvshm: TensorRT-LLM KV events published by kvshmd on %s (replay %s)", zmq_endpoint, replay_endpoint)

    # -- the tee's producer side ------------------------------------------------------------------------------
    def enqueue(self, event: dict[str, Any]) -> None:
        """Translate and publish one native event (never blocks, never raises: errors are logged, counted)."""
        try:
            self.handle(event)
        except Exception as e:  # noqa: BLE001 - the engine's drain loop must go on, as with the tee
            self.errors += 1
            log.warning("kvshm: TensorRT-LLM KV event dropped: %s", e)

    def handle(self, event: dict[str, Any]) -> None:
        """The tee's translation of one native event (``KVCacheEventSerializer`` dict)."""
        if self.should_drop_event(event):
            return
        event_id = event["event_id"]
        if self._last_engine_event_id is not None and event_id != self._last_engine_event_id + 1:
            log.warning("kvshm: non-consecutive TensorRT-LLM event_id: expected %d, got %d",
                        self._last_engine_event_id + 1, event_id)
        self._last_engine_event_id = event_id
        data = event["data"]
        kind = data["type"]
        dp = event.get("attention_dp_rank", 0) or 0
        if kind == "stored":
            self.processing_initial_created_events = False
            tokens: list[int] = []
            hashes: list[int] = []
            bs = self.kv_block_size
            for block in data["blocks"]:
                block_tokens = block["tokens"]
                if len(block_tokens) > bs:
                    log.error("kvshm: block of %d tokens exceeds kv_block_size %d", len(block_tokens), bs)
                    return
                h = block["block_hash"]
                if h is None:
                    continue
                h %= _U64
                if len(block_tokens) < bs:  # a partial block ends the chain; its removal is suppressed later
                    self.partial_block_hashes.add(h)
                    break
                hashes.append(h)
                tokens.extend(int(t["token_id"]) for t in block_tokens)
            parent = data.get("parent_hash")
            self._publish(
                ke.BlockStored(hashes, None if parent is None else parent % _U64, tokens, bs, None, "GPU",
                               data.get("lora_name")),
                dp,
            )
        elif kind == "removed":
            self.processing_initial_created_events = False
            removed: list[int] = []
            for h in data["block_hashes"]:
                if h is None:
                    continue
                h %= _U64
                if h in self.partial_block_hashes:
                    self.partial_block_hashes.remove(h)
                    continue
                removed.append(h)
            self._publish(ke.BlockRemoved(removed, "GPU"), dp)
        elif kind == "created" and self.processing_initial_created_events:
            self.update_max_window_size(event)

    def publish_all_cleared(self) -> None:
        """Publish an AllBlocksCleared event (every rank of the worker)."""
        self._publish(ke.AllBlocksCleared(), 0)

    def _publish(self, ev: Any, dp: int) -> None:
        seq = self.sequence
        self.sequence += 1  # advanced even when dropped: subscribers see an honest gap, as with the tee
        core = self.indexer._core  # the package's own counters: stats() would cost a dict build per event
        before = core.batch_records_dropped
        self.indexer.apply_batch(seq, [ev], ts=time.time(), dp_rank=dp)
        if core.batch_records_dropped != before:
            self.dropped += 1

    def update_max_window_size(self, event: dict[str, Any]) -> None:
        """Track the largest attention window of the initial "created" events."""
        if "window_size" in event:
            w = event["window_size"]
            if self.max_window_size is None or w > self.max_window_size:
                self.max_window_size = w

    def should_drop_event(self, event: dict[str, Any]) -> bool:
        """Keep only events of the global (max-window) attention layer, once the initial events set it."""
        if "window_size" not in event or self.processing_initial_created_events:
            return False
        return bool(event["window_size"] != self.max_window_size)

    def shutdown(self) -> None:
        """Stop publishing (the private kvshmd, if any, is torn down)."""
        self.indexer.shutdown()
