"""The kvshmd binary for the daemon tests: ``$KVSHMD_BIN``, else the repository's build/kvshmd (``make build``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kvshmd_bin() -> Path:
    path = Path(os.environ.get("KVSHMD_BIN") or REPO / "build" / "kvshmd")
    if not os.access(path, os.X_OK):
        if os.environ.get("KVSHM_REQUIRE_TOOLS") == "1":
            pytest.fail(f"no kvshmd at {path} (make build)")
        pytest.skip(f"no kvshmd at {path} (make build)")
    return path
