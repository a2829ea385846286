"""The engine's truth: the block hashes in vLLM's own BlockPool (written by the ``kvshm_e2e_truth`` plugin,
``e2e/truthplugin``, after every scheduler step that changed them), or in SGLang's radix tree (the
``kvshm_e2e_sglang_truth`` plugin, ``e2e/sglang/truthplugin``, after every KV-event publish that changed it). A dead
engine's cache died with it: its truth is the empty set, whatever its last file said."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TRUTH_ENV = "KVSHM_E2E_TRUTH"


@dataclass(frozen=True)
class Truth:
    hashes: frozenset[int]
    step: int  # the scheduler step that wrote it (0: no step yet, or the engine is down)


EMPTY = Truth(frozenset(), 0)


def read(path: Path) -> Truth:
    """The last state the plugin wrote (a whole file: it renames over it); empty when none yet."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return EMPTY
    return Truth(frozenset(key(int(h)) for h in doc["hashes"]), int(doc["step"]))


def key(h: int) -> int:
    """The index key of an int block hash: its 64-bit pattern (SGLang's hashes are signed int64; vLLM's are
    already in [0, 2**64)). The judges read every hash through it."""
    return h % (1 << 64)
