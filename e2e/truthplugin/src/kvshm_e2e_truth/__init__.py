"""make e2e's truth: the block hashes in vLLM's own ``BlockPool``, as the ints vLLM publishes.

A ``vllm.general_plugins`` entry point (vLLM runs :func:`register` in every process at start-up). It wraps
``Scheduler.update_from_output``, the scheduler method that ends each engine step by publishing the step's KV
events: right after it, the pool's ``cached_block_hash_to_block`` is exactly the state the published events lead
to. Each time that set changes, it is written to ``$KVSHM_E2E_TRUTH`` (JSON ``{"pid", "step", "hashes"}``; a
temporary file renamed over it, so a reader never sees half a file). Without the variable the plugin does nothing.

Hashes are converted as vLLM converts them for its events (``maybe_convert_block_hash``: the low 64 bits of the
big-endian bytes unless ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, then hex of the bytes).
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

TRUTH_ENV: Final = "KVSHM_E2E_TRUTH"

_patched = False


def _hashes(scheduler: Any) -> list[int | str]:
    from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

    pool = scheduler.kv_cache_manager.block_pool
    out: list[int | str] = []
    for key in list(pool.cached_block_hash_to_block._cache):
        h = maybe_convert_block_hash(get_block_hash(key))
        out.append(h.hex() if isinstance(h, bytes) else int(h))
    return sorted(out, key=str)


def write(path: str, step: int, hashes: list[int | str]) -> None:
    """The truth file (the SGLang truth plugin writes it with this too): a temporary file renamed over it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "step": step, "hashes": hashes}, f)
    os.replace(tmp, path)


def register() -> None:
    """Wrap ``Scheduler.update_from_output`` once per process (vLLM may call plugins more than once)."""
    global _patched
    path = os.environ.get(TRUTH_ENV, "")
    if not path or _patched:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output
    state: dict[str, Any] = {"step": 0, "last": None}

    def update_from_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        state["step"] += 1
        hashes = _hashes(self)
        if hashes != state["last"]:
            state["last"] = hashes
            write(path, state["step"], hashes)
        return result

    Scheduler.update_from_output = update_from_output
    _patched = True
