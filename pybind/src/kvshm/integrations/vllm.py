"""vLLM KV-event publisher plugin: ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "kvshm", ...}'``.

vLLM publishes its KV-cache events through an ``EventPublisher`` chosen by name in ``EventPublisherFactory``. This
module adds ``"kvshm"``: :class:`KvshmEventPublisher` writes each ``KVEventBatch`` once into kvshm's shared-memory
ring (:meth:`kvshm.LocalIndexer.apply_batch`, on the scheduler's thread, no queue, no encoding), and kvshmd
publishes it on ZMQ in vLLM's own wire format (PUB on ``endpoint``, replay ROUTER on ``replay_endpoint``, the same
framing, seqs and replay protocol as vLLM's ``ZmqEventPublisher``) and answers Dynamo's ``/kv_recover`` queries from
the same events.

Installation: ``pip install kvshm`` registers :func:`register` under the ``vllm.general_plugins`` entry point, which
vLLM runs in every process at start-up. It registers the publisher in ``EventPublisherFactory`` and widens
``KVEventsConfig.publisher`` (vLLM 0.33.0 declares ``Literal["null", "zmq"]`` in a pydantic dataclass that forbids
anything else) to accept ``"kvshm"``. Set ``VLLM_PLUGINS`` to a list without ``kvshm`` to turn it off.

Configuration: the ``KVEventsConfig`` fields as for ``"zmq"`` (``endpoint``, ``replay_endpoint``, ``topic``,
``hwm``, ``buffer_steps``; the dp rank's port offset as vLLM applies it; ``max_queue_size`` bounds the batches held
before the block size is known, below). The environment gives what vLLM does not pass to a publisher:
``KVSHM_WORKER_ID`` (the worker id of the recovery answers, default 0), ``KVSHM_KV_BLOCK_SIZE`` (else the first
``BlockStored``'s ``block_size``: batches before it are held, at most ``max_queue_size``, oldest dropped and
counted), and every ``LocalIndexer`` variable (``KVSHM_SOCKET`` for a shared kvshmd, ``KVSHM_RING_BYTES``, ...).
Seqs follow vLLM's rule: a counter from 0 per publisher, one per published batch (vLLM publishes only non-empty
batches; an empty one is ignored and takes no seq).

Errors: a bad event (a programmer error in vLLM or a connector) is logged and counted, never raised into the
scheduler; ``publish`` after ``shutdown`` raises ``RuntimeError`` as vLLM's publisher does. The daemon being away or
the ring being full never blocks or raises (kvshm counts the loss).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Final

from .. import LocalIndexer, ZmqPublish

__all__ = ["KvshmEventPublisher", "register"]

log = logging.getLogger("kvshm.vllm")

WORKER_ID_ENV: Final = "KVSHM_WORKER_ID"
KV_BLOCK_SIZE_ENV: Final = "KVSHM_KV_BLOCK_SIZE"
PUBLISHER_NAME: Final = "kvshm"


def _env_int(name: str, default: int | None) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise ValueError(f"kvshm: {name}={text!r} is not a non-negative integer")
    return int(text)


class KvshmEventPublisher:
    """A vLLM ``EventPublisher`` (registered as a virtual subclass of vLLM's ABC by :func:`register`) that hands
    every batch to kvshmd through the ring. Constructed by ``EventPublisherFactory.create`` with the
    ``KVEventsConfig`` fields as keyword arguments."""

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        **rest: Any,
    ) -> None:
        if rest:
            log.debug("kvshm: ignoring KVEventsConfig fields %s", sorted(rest))
        self._dp = int(data_parallel_rank or 0)
        self._publish = ZmqPublish(
            endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic, hwm=hwm, buffer_steps=buffer_steps
        )
        self._config = {
            "endpoint": endpoint,
            "replay_endpoint": replay_endpoint,
            "buffer_steps": buffer_steps,
            "hwm": hwm,
            "max_queue_size": max_queue_size,
            "topic": topic,
        }
        self._worker_id = _env_int(WORKER_ID_ENV, 0) or 0
        self._max_held = max(1, int(max_queue_size))
        self._lock = threading.Lock()
        self._seq = 0
        self._held: deque[tuple[int, Any]] = deque()
        self.held_dropped = 0  # batches dropped while waiting for the block size
        self.errors = 0  # batches refused as bad input (logged)
        self._closed = False
        self._indexer: LocalIndexer | None = None
        block_size = _env_int(KV_BLOCK_SIZE_ENV, None)
        if block_size is not None:
            self._start(block_size)

    @property
    def indexer(self) -> LocalIndexer | None:
        """The LocalIndexer (None until the block size is known)."""
        return self._indexer

    def _start(self, kv_block_size: int) -> None:
        self._indexer = LocalIndexer(
            self._worker_id, kv_block_size, dp_rank=self._dp, publish=self._publish
        )
        log.info(
            "kvshm: publishing vLLM KV events of worker %d dp_rank %d (block size %d) through kvshmd on %s",
            self._worker_id, self._dp, kv_block_size, self._publish.for_rank(self._dp).endpoint,
        )

    def publish(self, events: Any) -> None:
        """Publish one ``KVEventBatch`` (``ts``, ``events``, ``data_parallel_rank``): one ring write."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Publisher is closed")
            evs = events.events
            if not evs:
                return
            seq = self._seq
            self._seq += 1
            ix = self._indexer
            if ix is None:
                size = next((e.block_size for e in evs if e.__class__.__name__ == "BlockStored"), None)
                if size is None:
                    self._held.append((seq, events))
                    if len(self._held) > self._max_held:
                        self._held.popleft()
                        self.held_dropped += 1
                        log.warning("kvshm: dropped a KV-event batch held while the block size is unknown "
                                    "(set %s)", KV_BLOCK_SIZE_ENV)
                    return
                self._start(int(size))
                ix = self._indexer
                assert ix is not None
                held, self._held = self._held, deque()
                for s, b in held:
                    self._apply(ix, s, b)
            self._apply(ix, seq, events)

    def _apply(self, ix: LocalIndexer, seq: int, batch: Any) -> None:
        dp = getattr(batch, "data_parallel_rank", None)
        try:
            ix.apply_batch(seq, batch.events, ts=batch.ts, dp_rank=self._dp if dp is None else dp)
        except (TypeError, ValueError) as e:
            self.errors += 1
            log.error("kvshm: KV-event batch %d not published: %s", seq, e)

    def shutdown(self) -> None:
        """Stop publishing; the private kvshmd (if any) is torn down, a shared one keeps the stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ix, self._indexer = self._indexer, None
        if ix is not None:
            ix.shutdown()

    def get_publisher_config(self) -> Any:
        """vLLM's ``KVEventsConfig`` of this publisher (endpoints with the dp rank's offset), or None without
        vLLM."""
        try:
            from vllm.config.kv_events import KVEventsConfig
        except ImportError:
            return None
        p = self._publish.for_rank(self._dp)
        cfg = dict(self._config, endpoint=p.endpoint, replay_endpoint=p.replay_endpoint)
        return KVEventsConfig(enable_kv_cache_events=True, publisher=PUBLISHER_NAME, **cfg)


def _widen_publisher_field() -> None:
    """Make vLLM's KVEventsConfig accept ``publisher="kvshm"`` (0.33.0: ``Literal["null", "zmq"]``, validated by
    pydantic). Idempotent; a vLLM whose field already accepts it (a plain ``str``, or a Literal with "kvshm") is
    left alone."""
    from typing import Literal, get_args, get_origin

    from vllm.config.kv_events import KVEventsConfig

    fields = getattr(KVEventsConfig, "__pydantic_fields__", None)
    field = None if fields is None else fields.get("publisher")
    if field is None:
        return
    ann = field.annotation
    if get_origin(ann) is not Literal or PUBLISHER_NAME in get_args(ann):
        return
    widened = Literal[(*get_args(ann), PUBLISHER_NAME)]  # type: ignore[valid-type]
    # pydantic rebuilds a dataclass's schema from the dataclass fields' types: change them all.
    KVEventsConfig.__dataclass_fields__["publisher"].type = widened
    KVEventsConfig.__annotations__["publisher"] = widened
    field.annotation = widened
    from pydantic.dataclasses import rebuild_dataclass

    rebuild_dataclass(KVEventsConfig, force=True)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers ``"kvshm"`` in vLLM's ``EventPublisherFactory`` and
    widens ``KVEventsConfig.publisher`` to accept it. Safe to call more than once (vLLM loads plugins in every
    process, possibly several times)."""
    from vllm.distributed.kv_events import EventPublisher, EventPublisherFactory

    try:
        EventPublisherFactory.register_publisher(PUBLISHER_NAME, KvshmEventPublisher)
    except KeyError:
        pass  # already registered (a second load)
    EventPublisher.register(KvshmEventPublisher)
    _widen_publisher_field()
