"""What kvshm's engine publishers share (:mod:`kvshm.integrations.vllm`, :mod:`kvshm.integrations.sglang`): one
``LocalIndexer`` per publisher, every batch written once into the ring on the engine's thread, the engine's seq
rule, and the error contract (nothing raised into the engine after construction; a dropped batch counted and
logged, rate-limited).

The engine-specific parts (which config gives the block size, which batch field holds the DP rank, the wire) are
the subclass's: it computes them and calls :meth:`RingPublisher.__init__` last, so that a configuration error it
raises leaves nothing to undo.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Final

from .. import LocalIndexer, ZmqPublish

__all__ = ["RingPublisher", "env_int", "WORKER_ID_ENV", "KV_BLOCK_SIZE_ENV"]

WORKER_ID_ENV: Final = "KVSHM_WORKER_ID"
KV_BLOCK_SIZE_ENV: Final = "KVSHM_KV_BLOCK_SIZE"
_LOG_INTERVAL: Final = 10.0  # seconds between two logged publish errors (the others are counted)
_clock = time.monotonic  # the error log's rate limit (a test replaces it)


def env_int(name: str, default: int | None) -> int | None:
    """A non-negative integer from the environment (``default`` when unset or blank); ValueError otherwise."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise ValueError(f"kvshm: {name}={text!r} is not a non-negative integer")
    return int(text)


class RingPublisher:
    """An engine ``EventPublisher`` that hands every batch to kvshmd through the ring (``publish``, ``shutdown``).
    ``dp_field`` names the batch attribute holding the DP rank (None there: the publisher's own)."""

    dp_field: str = "data_parallel_rank"

    def __init__(self, *, worker_id: int, block_size: int, dp_rank: int, publish: ZmqPublish,
                 log: logging.Logger) -> None:
        self._dp = dp_rank
        self._worker_id = worker_id
        self._publish = publish
        self._log = log
        self.kv_block_size = block_size
        self._lock = threading.Lock()
        self._seq = 0  # protected by _lock
        self._closed = False  # protected by _lock
        self.errors = 0  # batches dropped (protected by _lock)
        self.last_error: str | None = None  # protected by _lock
        self._unlogged = 0  # errors since the last logged one (protected by _lock)
        self._next_log = 0.0  # monotonic time of the next error line allowed (protected by _lock)
        # Last: nothing above needs undoing if it raises (bind error, no daemon, bad ring size...).
        self._indexer: LocalIndexer | None = LocalIndexer(worker_id, block_size, dp_rank=dp_rank, publish=publish)

    @property
    def indexer(self) -> LocalIndexer | None:
        """The LocalIndexer (None after shutdown)."""
        return self._indexer

    def publish(self, events: Any) -> None:
        """Publish one batch (``ts``, ``events``, the DP rank in ``dp_field``): one ring write. Engine seqs: a
        counter from 0 per publisher, one per non-empty batch (an empty one takes none); a dropped batch keeps its
        seq. Never raises except ``RuntimeError`` after ``shutdown``, as the engines' own publishers do."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Publisher is closed")
            seq = None
            try:
                evs = events.events
                if not evs:
                    return
                seq = self._seq
                self._seq += 1
                ix = self._indexer
                assert ix is not None  # set until _closed
                dp = getattr(events, self.dp_field, None)
                ix.apply_batch(seq, evs, ts=events.ts, dp_rank=self._dp if dp is None else dp)
            except Exception as e:  # the scheduler must never see it
                self._dropped(seq, e)

    def _dropped(self, seq: int | None, e: Exception) -> None:
        """Count a dropped batch and log it, at most once per _LOG_INTERVAL (with _lock held)."""
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"
        now = _clock()
        if now < self._next_log:
            self._unlogged += 1
            return
        self._next_log = now + _LOG_INTERVAL
        more, self._unlogged = self._unlogged, 0
        self._log.error("kvshm: KV-event batch %s not published (%s)%s", "?" if seq is None else seq,
                        self.last_error, f"; {more} more dropped since the last message" if more else "",
                        exc_info=not isinstance(e, (TypeError, ValueError, AttributeError)))

    def shutdown(self) -> None:
        """Stop publishing; the private kvshmd (if any) is torn down, a shared one keeps the stream. Never
        raises (logged)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ix, self._indexer = self._indexer, None
        if ix is not None:
            try:
                ix.shutdown()
            except Exception as e:  # the engine's shutdown goes on
                self._log.error("kvshm: shutting down the LocalIndexer failed: %s", e, exc_info=True)
