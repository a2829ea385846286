"""Wheel tag for kvshm (everything else is in pyproject.toml).

The Python code is pure, but the wheel carries ``kvshm/_bin/kvshmd``, a static (CGO_ENABLED=0) Linux x86-64
executable, and the ring writer's single-store publication is only a release on x86-64. So the wheel is
``py3-none-<platform>``: any CPython 3.11+, no ABI, and a platform tag saying "Linux x86-64, any libc":
manylinux_2_17 (the oldest glibc floor current pip and PyPI accept; the binary needs none) plus musllinux_1_1
(it needs no musl either). ``linux_x86_64`` would be equally true locally but cannot be uploaded to an index.
"""

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel

PLATFORM = "manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64"


class BinaryDistribution(Distribution):
    """Marks the distribution as platform-specific, so the wheel root is platlib (Root-Is-Purelib: false)."""

    def has_ext_modules(self) -> bool:
        return True


class BinaryWheel(bdist_wheel):
    """Tagged py3-none-PLATFORM instead of the interpreter-specific cpXY-cpXY tag of an extension wheel."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", PLATFORM


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": BinaryWheel})
