"""make e2e-sglang's truth: the block hashes in SGLang's own radix tree, as the ints SGLang publishes.

A ``sglang.srt.plugins`` entry point (SGLang runs :func:`register` in its processes at start-up). It wraps
``SchedulerKvEventsPublisher.publish_kv_events``, the scheduler step that takes the tree's pending KV events and
publishes them: right after it, the tree's device pages are exactly the state the published events lead to. Each
time that set changes, it is written to ``$KVSHM_E2E_TRUTH`` by the vLLM truth plugin's writer (``kvshm_e2e_truth``,
installed beside this package: the same file, JSON ``{"pid", "step", "hashes"}``). Without the variable the plugin
does nothing.

Reading the tree: SGLang 0.5.23's tree core is Rust (``RustUnifiedTreeCore``) and its production binding has no way
to list nodes (the inspection build that has one is compiled only for SGLang's own tests). Node handles are ints
minted in increasing order and never re-minted, and ``get_hash_values(node)`` answers only for a node in the tree:
so the plugin probes every handle not yet known dead, up to :data:`_PROBE_AHEAD` past the highest live one, and
takes each live, non-root, device-resident node's page hashes (``hash_str_to_int64``, as SGLang's event recorder
converts them; no LoRA here, so no namespace). A handle that stops answering is dead for good.
"""

from __future__ import annotations

import os
from typing import Any, Final

from kvshm_e2e_truth import write  # the truth file's one writer (vLLM's truth plugin, installed beside this one)

TRUTH_ENV: Final = "KVSHM_E2E_TRUTH"
_PROBE_AHEAD: Final = 512  # handles probed past the highest live one (more than one step's new nodes)

_patched = False


class _Prober:
    """The live handles of one tree core (dead ones are skipped for good)."""

    def __init__(self) -> None:
        self.dead: set[int] = set()
        self.high = 0  # one past the highest handle seen alive

    def hashes(self, core: Any) -> list[int]:
        from sglang.srt.mem_cache.utils import hash_str_to_int64

        b = core._binding
        out: list[int] = []
        nid = 0
        while nid < self.high + _PROBE_AHEAD:
            if nid not in self.dead:
                try:
                    root = b.is_root(nid)
                    values = None if root else b.get_hash_values(nid)
                    evicted = False if root else b.is_full_device_evicted(nid)
                except BaseException:  # pyo3 raises PanicException (a BaseException) for an unknown handle
                    if nid < self.high:
                        self.dead.add(nid)
                else:
                    self.high = max(self.high, nid + 1)
                    if values and not evicted:
                        out.extend(hash_str_to_int64(v) for v in values)
            nid += 1
        return sorted(out)


def register() -> None:
    """Wrap ``SchedulerKvEventsPublisher.publish_kv_events`` once per process."""
    global _patched
    path = os.environ.get(TRUTH_ENV, "")
    if not path or _patched:
        return
    from sglang.srt.managers.scheduler_components.kv_events_publisher import SchedulerKvEventsPublisher

    original = SchedulerKvEventsPublisher.publish_kv_events
    state: dict[str, Any] = {"step": 0, "last": None, "prober": _Prober(), "core": None, "dirty": True}

    def watch(tree_cache: Any) -> None:
        """Mark the truth dirty whenever the tree hands out events (the scheduler polls publish_kv_events on every
        idle loop: probing only after a change keeps the engine's idle loop cheap)."""
        take = tree_cache.take_events

        def take_events() -> Any:
            events = take()
            if events:
                state["dirty"] = True
            return events

        tree_cache.take_events = take_events
        tree_cache._kvshm_e2e_truth = True

    def publish_kv_events(self: Any) -> Any:
        tc = self.tree_cache
        if not getattr(tc, "_kvshm_e2e_truth", False):
            watch(tc)
        result = original(self)
        core = getattr(tc, "tree_core", None)
        if core is None or not state["dirty"]:
            return result
        state["dirty"] = False
        if core is not state["core"]:
            state["core"], state["prober"] = core, _Prober()
        state["step"] += 1
        hashes = state["prober"].hashes(core)
        if hashes != state["last"]:
            state["last"] = hashes
            write(path, state["step"], hashes)
        return result

    SchedulerKvEventsPublisher.publish_kv_events = publish_kv_events
    _patched = True
