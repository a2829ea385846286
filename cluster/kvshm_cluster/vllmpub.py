"""vLLM's own publisher without importing vLLM: ``vllm/distributed/kv_events.py`` of the installed vllm (0.32.0 in
the e2e venv) executed unmodified, its four imports from the rest of vLLM given as small stand-ins (a config
record, the logger, the network helpers it calls only for ``tcp://*:0``, a type alias). ``import vllm`` costs
~30 s and ~1 GB per process (torch); this costs what pyzmq and msgspec cost, so a node can run many producers.
The classes (``ZmqEventPublisher``, ``KVEventBatch``, ``BlockStored``, ...) are vLLM's own code."""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any


def _stub(name: str, **attrs: Any) -> None:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod


class _KVEventsConfig:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _no_wildcard_port(*_: Any) -> Any:
    raise ValueError("the cluster binds explicit ports, never tcp://*:0")


def load(site_packages: str | None = None) -> types.ModuleType:
    """The real ``vllm.distributed.kv_events`` module (found on ``sys.path`` or under ``site_packages``)."""
    if "vllm.distributed.kv_events" in sys.modules:
        return sys.modules["vllm.distributed.kv_events"]
    roots = [Path(p) for p in ([site_packages] if site_packages else sys.path) if p]
    src = next((r / "vllm" / "distributed" / "kv_events.py" for r in roots
                if (r / "vllm" / "distributed" / "kv_events.py").is_file()), None)
    if src is None:
        raise FileNotFoundError("vllm/distributed/kv_events.py not found: run under the e2e venv")
    for pkg in ("vllm", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core", "vllm.distributed"):
        _stub(pkg, __path__=[])
    _stub("vllm.config.kv_events", KVEventsConfig=_KVEventsConfig)
    _stub("vllm.logger", init_logger=logging.getLogger)
    _stub("vllm.utils.network_utils", get_ip=_no_wildcard_port, get_tcp_uri=_no_wildcard_port,
          is_valid_ipv6_address=_no_wildcard_port, split_zmq_path=_no_wildcard_port)
    _stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    spec = importlib.util.spec_from_file_location("vllm.distributed.kv_events", src)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm.distributed.kv_events"] = mod
    spec.loader.exec_module(mod)
    mod.__file__ = str(src)
    return mod
