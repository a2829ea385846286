"""Fixtures: LocalIndexers on private rings and shared kvshmd daemons.

`make pytest` runs this suite against the wheel installed in a fresh venv (KVSHM_TEST_INSTALLED=1). During
development: `PYTHONPATH=pybind/src KVSHMD_BIN=$PWD/pybind/src/kvshm/_bin/kvshmd .venv/bin/pytest pybind/tests`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvshm import LocalIndexer

from helpers import SharedDaemon

os.environ.setdefault("KVSHMD_LOG_LEVEL", "warn")  # keep the private daemons' logs short
# Private daemons checkpoint every second here (default 10 s) so the crash tests need not wait for the first one.
os.environ.setdefault("KVSHM_CHECKPOINT_INTERVAL", "1s")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their daemon explicitly: an inherited KVSHM_SOCKET must not redirect them."""
    for name in ("KVSHM_SOCKET", "KVSHM_RING_DIR", "KVSHM_RING_BYTES", "KVSHM_DP_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private 0700 directory with a short path (a Unix socket path must stay under 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="kvt-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ring_dir(short_dir: Path) -> Path:
    d = short_dir / "rings"
    d.mkdir(mode=0o700)
    return d


IndexerFactory = Callable[..., LocalIndexer]


@pytest.fixture
def make_indexer(ring_dir: Path) -> Iterator[IndexerFactory]:
    """Builds LocalIndexers whose rings live in ``ring_dir`` (1 MiB by default); shuts them down afterwards and
    checks that no ring file was left behind."""
    made: list[LocalIndexer] = []

    def make(worker_id: int = 7, kv_block_size: int = 4, max_buffer_size: int = 10000, **kw: Any) -> LocalIndexer:
        kw.setdefault("ring_dir", ring_dir)
        kw.setdefault("ring_bytes", 1 << 20)
        ix = LocalIndexer(worker_id, kv_block_size, max_buffer_size, **kw)
        made.append(ix)
        return ix

    yield make
    for ix in made:
        ix.shutdown()
    assert list(ring_dir.iterdir()) == [], "ring files left behind after shutdown()"


@pytest.fixture
def shared_daemon(short_dir: Path) -> Iterator[SharedDaemon]:
    """A running shared kvshmd on ``short_dir/kvshmd.sock``."""
    d = SharedDaemon(str(short_dir / "kvshmd.sock"), short_dir / "kvshmd.log")
    d.start()
    yield d
    d.stop()


@pytest.fixture
def shared_socket(short_dir: Path) -> Iterator[SharedDaemon]:
    """Like shared_daemon, but not started: the test starts (and restarts) it."""
    d = SharedDaemon(str(short_dir / "kvshmd.sock"), short_dir / "kvshmd.log")
    yield d
    d.stop()
