"""What the wheel must deliver: the installed package (not the source tree), a static kvshmd, typing markers."""

from __future__ import annotations

import importlib.metadata
import os
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import kv_local_indexer
import kvshm
from kvshm._launcher import packaged_kvshmd

from helpers import REPO

INSTALLED = os.environ.get("KVSHM_TEST_INSTALLED") == "1"
PT_INTERP = 3
PT_DYNAMIC = 2


@pytest.mark.skipif(not INSTALLED, reason="set by `make pytest`, which runs the suite against the installed wheel")
def test_tests_import_the_installed_wheel() -> None:
    src = REPO / "pybind" / "src"
    for module in (kvshm, kv_local_indexer):
        assert module.__file__ is not None
        path = Path(module.__file__).resolve()
        assert src not in path.parents, f"{module.__name__} imported from the source tree: {path}"
        assert "site-packages" in path.parts
    dist = importlib.metadata.distribution("kvshm")
    assert dist.version == kvshm.__version__
    assert any(str(f).endswith("_bin/kvshmd") for f in dist.files or [])


def program_header_types(path: Path) -> list[int]:
    """ELF64 little-endian program header types of ``path``."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    (machine,) = struct.unpack_from("<H", data, 18)
    assert machine == 62, f"e_machine {machine} is not x86-64"
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    return [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]


def test_packaged_kvshmd_is_a_static_x86_64_executable() -> None:
    binary = packaged_kvshmd()
    if not binary.exists():
        pytest.skip("source checkout without `make wheel`: no packaged kvshmd")
    assert os.access(binary, os.X_OK)
    types = program_header_types(binary)
    assert PT_INTERP not in types and PT_DYNAMIC not in types, "kvshmd is dynamically linked"
    if INSTALLED:  # the wheel's daemon is stamped with the package version
        out = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == f"v{kvshm.__version__}", out


def test_typed_package_and_public_api() -> None:
    assert Path(kvshm.__file__ or "").with_name("py.typed").exists()
    assert Path(kv_local_indexer.__file__ or "").with_name("py.typed").exists()
    assert set(kvshm.__all__) == {
        "ClosedError", "ForkedProcessError", "KvshmError", "LauncherError", "LocalIndexer", "RingError", "__version__",
        "ZmqPublish", "events", "IndexerStats", "BatchStats", "LostRange",
    }
    assert kv_local_indexer.__all__ == ["LocalIndexer"]
    for name in ("ClosedError", "ForkedProcessError", "LauncherError"):
        assert issubclass(getattr(kvshm, name), kvshm.KvshmError)
    assert issubclass(kvshm.KvshmError, RuntimeError)


def test_version_has_one_home() -> None:
    """kvshm.__version__ is pyproject.toml's, installed (through the wheel's metadata) or from the source tree."""
    with open(REPO / "pybind" / "pyproject.toml", "rb") as f:
        want = tomllib.load(f)["project"]["version"]
    assert kvshm.__version__ == want
    if INSTALLED:
        assert importlib.metadata.version("kvshm") == want


def test_runtime_needs_no_flatbuffers(tmp_path: Path) -> None:
    """The wheel declares no dependencies: the runtime path never imports the flatbuffers package."""
    script = (
        "import sys; sys.modules['flatbuffers'] = None  # any import of it now fails\n"
        "from kvshm import LocalIndexer\n"
        f"with LocalIndexer(0, 2, ring_dir={str(tmp_path)!r}, ring_bytes=1 << 20) as ix:\n"
        "    ix.apply_stored(0, [1, 2, 3, 4], [-7, 8])\n"
        "    print(ix.get_events_json(0))\n"
        "assert 'flatbuffers' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('{"Events":')
    assert list(tmp_path.iterdir()) == []
    if INSTALLED:
        assert importlib.metadata.requires("kvshm") == ['flatbuffers==25.12.19; extra == "fbs"']


@pytest.mark.skipif(not INSTALLED, reason="set by `make pytest`, which runs the suite against the installed wheel")
def test_kvshmd_console_command_runs_the_packaged_daemon() -> None:
    script = Path(sys.executable).parent / "kvshmd"
    assert script.is_file(), f"the wheel installs no kvshmd command next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "KVSHMD_BIN"}
    out = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0, out.stderr
    assert kvshm.__version__ in out.stdout, out.stdout
    usage = subprocess.run([str(script), "no-such-command"], capture_output=True, text=True, timeout=30, env=env)
    assert usage.returncode == 2, (usage.returncode, usage.stderr)  # the Go binary's usage exit code, passed through
