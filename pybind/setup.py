"""The platform wheels of kvshm (everything else is in pyproject.toml).

A wheel carries two compiled pieces for one CPU, both independent of the libc:

* ``kvshm/_bin/kvshmd``: the daemon, a static (CGO_ENABLED=0) Linux executable, built by ``make wheel`` per GOARCH.
* ``kvshm/_ringsync.abi3.so``: the ring writer's release store and doorbell fence (pybind/csrc/_ringsync.c), built
  against the Limited API of CPython 3.11 (abi3: one file for every CPython >= 3.11) and linked without libc (it
  imports only CPython's symbols and ``syscall``, which glibc and musl both provide).

So the wheel is ``cp311-abi3-<platform>``: "Linux on this CPU, any libc": manylinux_2_17 (the oldest glibc floor
current pip and PyPI accept; aarch64's glibc starts there) plus musllinux_1_1. ``linux_<cpu>`` would be equally true
locally but cannot be uploaded to an index.

The CPU comes from ``KVSHM_WHEEL_ARCH`` (``x86_64`` or ``aarch64``; default: this machine's). Building for another
CPU cross-compiles the extension with ``KVSHM_CC`` (default ``aarch64-linux-gnu-gcc`` / ``x86_64-linux-gnu-gcc``,
Debian's cross compilers) and this interpreter's headers: the Limited API's structures and the LP64 sizes are the
same on both CPUs. ``make wheel`` checks each built extension's CPU with ``file``.
"""

from __future__ import annotations

import os
import platform
import shlex

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ARCHES = {"x86_64": "x86_64-linux-gnu-gcc", "aarch64": "aarch64-linux-gnu-gcc"}
HOST = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
ARCH = os.environ.get("KVSHM_WHEEL_ARCH") or HOST
if ARCH not in ARCHES:
    raise SystemExit(f"kvshm setup.py: KVSHM_WHEEL_ARCH {ARCH!r} is not one of {sorted(ARCHES)}")
PLATFORM = f"manylinux_2_17_{ARCH}.manylinux2014_{ARCH}.musllinux_1_1_{ARCH}"
LIMITED_API = "0x030B0000"  # CPython 3.11: PyObject_GetBuffer joined the Limited API
CFLAGS = ["-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-fno-stack-protector"]


class CompileExtension(build_ext):
    """Compiles with a fixed command line (not the interpreter's build flags, which name its own CPU and toolchain),
    with the cross compiler when ARCH is not this machine's."""

    def build_extensions(self) -> None:
        cc = shlex.split(os.environ.get("KVSHM_CC") or ("cc" if ARCH == HOST else ARCHES[ARCH]))
        self.compiler.set_executables(compiler_so=[*cc, *CFLAGS], linker_so=[*cc, "-shared", "-nostdlib"])
        super().build_extensions()


class PlatformWheel(bdist_wheel):
    """Tagged cp311-abi3-PLATFORM (setuptools would tag the building interpreter's version and CPU)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "cp311", "abi3", PLATFORM


setup(
    ext_modules=[
        Extension(
            "kvshm._ringsync",
            ["csrc/_ringsync.c"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", LIMITED_API)],
        )
    ],
    cmdclass={"build_ext": CompileExtension, "bdist_wheel": PlatformWheel},
)
