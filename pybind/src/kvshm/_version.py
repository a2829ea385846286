"""``kvshm.__version__`` from its one home, pybind/pyproject.toml: an installed package reads it from its
distribution metadata (which the build writes from pyproject.toml); a source tree (``PYTHONPATH=pybind/src``) reads
pyproject.toml itself, so a different kvshm installed beside it cannot lend it its version."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

__all__ = ["package_version"]


def package_version() -> str:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"  # src/kvshm/_version.py -> pybind/
    if pyproject.is_file():
        with open(pyproject, "rb") as f:
            project = tomllib.load(f).get("project", {})
        if project.get("name") == "kvshm" and "version" in project:
            return str(project["version"])
    try:
        return importlib.metadata.version("kvshm")
    except importlib.metadata.PackageNotFoundError:  # neither installed nor in its source tree
        return "0+unknown"
