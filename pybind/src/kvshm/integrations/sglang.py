"""SGLang KV-event publisher plugin: ``--kv-events-config '{"publisher": "kvshm", "endpoint": "tcp://*:5557", ...}'``.

SGLang publishes its KV-cache events through an ``EventPublisher`` chosen by name in
``sglang.srt.disaggregation.kv_events.EventPublisherFactory``. This module adds ``"kvshm"``:
:class:`KvshmSGLangPublisher` writes each ``KVEventBatch`` once into kvshm's shared-memory ring
(:meth:`kvshm.LocalIndexer.apply_batch`, on the scheduler's thread, no queue, no encoding), and kvshmd publishes it
on ZMQ in SGLang 0.5.23's own wire format (vllmwire's ``"sglang"`` layout: signed int64 block hashes, SGLang's
BlockStored; PUB on ``endpoint``, replay ROUTER on ``replay_endpoint``, the framing and replay protocol of SGLang's
``ZmqEventPublisher``; the seqs are kvshmd's, docs/lifecycle.md) and answers Dynamo's ``/kv_recover`` from the same
events.
The shared machinery (one ring write per batch, the seq rule, the error contract) is
:class:`kvshm.integrations._publisher.RingPublisher`, as for vLLM.

Installation: ``pip install kvshm`` registers :func:`register` under the ``sglang.srt.plugins`` entry point, which
SGLang runs (``load_plugins``) in its scheduler process before it builds the publisher; it calls
``EventPublisherFactory.register_publisher("kvshm", KvshmSGLangPublisher)``. SGLang's ``KVEventsConfig.publisher`` is
a plain ``str``, so nothing else is needed. ``SGLANG_PLUGINS`` set to a list without ``kvshm`` turns it off.

Construction decides everything (SGLang builds its publisher in the scheduler's ``__init__``; an error raised there
stops the server at start-up with its message, as a bind error of SGLang's own publisher does):

- the KV block size: ``KVSHM_KV_BLOCK_SIZE`` if set, else SGLang's ``page_size`` (the size of every page its radix
  cache publishes as one block) from the server arguments in effect in the scheduler process
  (``sglang.srt.runtime_context.get_server_args()``), else from the constructing scheduler's frame
  (``EventPublisherFactory.create``'s caller holds the ``tree_cache``, whose ``page_size`` it is). Neither:
  ``ValueError`` naming ``KVSHM_KV_BLOCK_SIZE``. The first BlockStored's ``block_size`` is not waited for: the
  ring is attached and kvshmd's sockets are bound at construction (so a taken port stops the server at start-up,
  and a subscriber that connects once the server is up gets seq 0 live), which needs the block size; SGLang 0.5.23
  always has its server arguments in the scheduler process, so the case does not arise there;
- the endpoints, as SGLang's publisher applies them: the attention-DP rank's port offset (``attn_dp_rank``, which
  SGLang passes as ``select_kv_publisher_dp_rank`` chose it), bound when SGLang would bind (``bind``, else its
  rule: ``*``, ``::``, ``0.0.0.0``, ``ipc://``); ``tcp://0.0.0.0:P`` is bound as ``tcp://*:P`` (the same IPv4
  interfaces). kvshmd binds exactly ``*``, ``::`` and ``ipc://`` endpoints and connects the others, so a ``bind``
  that contradicts that (true on a concrete host, false on a wildcard) and ``inproc://`` (kvshmd is another
  process) are ``ValueError``;
- the wire: SGLang's (``ZmqPublish(wire="sglang")``), and the ``LocalIndexer``, built before ``__init__`` returns.

Configuration: the ``KVEventsConfig`` fields as for ``"zmq"`` (``endpoint``, ``bind``, ``replay_endpoint``, ``topic``,
``hwm``, ``buffer_steps``; ``max_queue_size`` is ignored: nothing is queued; ``format`` is SGLang's own business: it
changes the hashes SGLang computes, kvshm publishes what it gets). The environment gives what SGLang does not pass:
``KVSHM_WORKER_ID`` (the worker id of the recovery answers, default 0), ``KVSHM_KV_BLOCK_SIZE``, and every
``LocalIndexer`` variable (``KVSHM_SOCKET`` for a shared kvshmd, ...). A batch's ``attn_dp_rank`` is its dp_rank
(None: the publisher's, as SGLang's publisher fills it).

Errors: as the vLLM plugin's (RingPublisher): once constructed, ``publish`` never raises into the scheduler except
``RuntimeError`` after ``shutdown`` (SGLang's publisher raises it too); a batch that cannot be published is dropped,
counted (``errors``, ``last_error``) and logged, rate-limited.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any, Final

from .. import ZmqPublish
from .._batch import SGLANG_WIRE
from ._publisher import KV_BLOCK_SIZE_ENV, WORKER_ID_ENV, RingPublisher, env_int

__all__ = ["KvshmSGLangPublisher", "register", "sglang_page_size"]

log = logging.getLogger("kvshm.sglang")

PUBLISHER_NAME: Final = "kvshm"
_FRAME_DEPTH: Final = 8  # frames above __init__ searched for the scheduler's tree_cache
_SGLANG_BINDS: Final = ("*", "::", "0.0.0.0")  # SGLang's bind heuristic (besides ipc:// and inproc://)


def _positive_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def sglang_page_size(frame: FrameType | None = None) -> tuple[int | None, str]:
    """SGLang's page size and where it was found (module docstring), or ``(None, "")``. SGLang is never imported
    here: inside SGLang's scheduler its runtime context is loaded already."""
    ctx = sys.modules.get("sglang.srt.runtime_context")
    get = getattr(ctx, "get_server_args", None)
    if get is not None:
        try:
            size = _positive_int(getattr(get(), "page_size", None))
        except Exception:  # not published in this process: the frames below still work
            size = None
        if size is not None:
            return size, "SGLang's server arguments"
    depth = 0
    while frame is not None and depth < _FRAME_DEPTH:
        owner = frame.f_locals.get("self")
        size = _positive_int(getattr(getattr(owner, "tree_cache", None), "page_size", None))
        if size is not None:
            return size, f"the caller {frame.f_code.co_qualname}'s tree_cache"
        frame = frame.f_back
        depth += 1
    return None, ""


def kvshm_endpoint(endpoint: str, bind: bool | None) -> str:
    """The endpoint kvshmd must be given to bind or connect as SGLang's publisher would (module docstring)."""
    if endpoint.startswith("inproc://"):
        raise ValueError(f"kvshm: endpoint {endpoint!r}: inproc:// cannot reach kvshmd (another process)")
    if endpoint.startswith("tcp://0.0.0.0:"):
        endpoint = "tcp://*:" + endpoint[len("tcp://0.0.0.0:"):]
    sglang_binds = bind if bind is not None else (
        any(w in endpoint for w in _SGLANG_BINDS) or endpoint.startswith("ipc://"))
    kvshm_binds = "*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://")
    if sglang_binds != kvshm_binds:
        raise ValueError(
            f"kvshm: endpoint {endpoint!r} with bind={bind}: kvshmd binds exactly tcp://*:port, tcp://[::]:port and "
            f"ipc:// endpoints and connects the others")
    return endpoint


class KvshmSGLangPublisher(RingPublisher):
    """An SGLang ``EventPublisher`` (registered as a virtual subclass of SGLang's ABC by :func:`register`) that
    hands every batch to kvshmd through the ring. Constructed by ``EventPublisherFactory.create`` with SGLang's
    ``KVEventsConfig`` fields as keyword arguments; raises what stops the server at start-up (module docstring)."""

    dp_field = "attn_dp_rank"

    def __init__(
        self,
        attn_dp_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        bind: bool | None = None,
        **rest: Any,
    ) -> None:
        if rest:
            log.debug("kvshm: ignoring KVEventsConfig fields %s", sorted(rest))
        dp = int(attn_dp_rank or 0)
        worker_id = env_int(WORKER_ID_ENV, 0) or 0
        env_size = env_int(KV_BLOCK_SIZE_ENV, None)
        cfg_size, where = sglang_page_size(sys._getframe(1))
        if env_size is not None and env_size > 0:
            block_size = env_size
            if cfg_size is not None and cfg_size != env_size:
                log.warning("kvshm: %s=%d overrides SGLang's page size %d (from %s)",
                            KV_BLOCK_SIZE_ENV, env_size, cfg_size, where)
            where = KV_BLOCK_SIZE_ENV
        elif cfg_size is not None:
            block_size = cfg_size
        else:
            raise ValueError(
                f"kvshm: cannot tell SGLang's page size (no server arguments in this process, no tree_cache in the "
                f"caller's frames); set {KV_BLOCK_SIZE_ENV}")
        publish = ZmqPublish(endpoint=kvshm_endpoint(endpoint, bind), replay_endpoint=replay_endpoint, topic=topic,
                             hwm=hwm, buffer_steps=buffer_steps, wire=SGLANG_WIRE)
        self.max_queue_size = max_queue_size  # accepted, unused: nothing is queued
        super().__init__(worker_id=worker_id, block_size=block_size, dp_rank=dp, publish=publish, log=log)
        log.info("kvshm: publishing SGLang KV events of worker %d attn_dp_rank %d (page size %d from %s) through "
                 "kvshmd on %s", worker_id, dp, block_size, where, publish.for_rank(dp).endpoint)

    def describe_local_source(self, block_size: int) -> dict[str, Any] | None:
        """SGLang's ``/server_info`` description of a local subscribable source: kvshmd's PUB (and replay)
        endpoint for this rank when it binds one on tcp or ipc, else None (as SGLang's publisher answers for a
        connect-style endpoint)."""
        p = self._publish.for_rank(self._dp)

        def local(ep: str | None) -> str | None:
            if ep is None:
                return None
            if ep.startswith("ipc://"):
                return ep
            for wild, host in (("tcp://*:", "tcp://127.0.0.1:"), ("tcp://[::]:", "tcp://[::1]:")):
                if ep.startswith(wild):
                    return host + ep[len(wild):]
            return None

        endpoint = local(p.endpoint)
        if endpoint is None:
            return None
        source: dict[str, Any] = {"dp_rank": self._dp, "endpoint": endpoint, "topic": p.topic,
                                  "block_size": block_size}
        replay = local(p.replay_endpoint)
        if replay is not None:
            source["replay_endpoint"] = replay
        return source


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: registers ``"kvshm"`` in SGLang's ``EventPublisherFactory``. Safe to
    call more than once (SGLang loads plugins in several processes, a second load is ignored)."""
    from sglang.srt.disaggregation.kv_events import EventPublisher, EventPublisherFactory

    try:
        EventPublisherFactory.register_publisher(PUBLISHER_NAME, KvshmSGLangPublisher)
    except KeyError:
        pass  # already registered (a second load)
    EventPublisher.register(KvshmSGLangPublisher)
