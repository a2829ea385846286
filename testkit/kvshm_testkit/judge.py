"""The extra/missing judge: a consumer's recovered blocks against the engine's true blocks.

``extra`` counts blocks the consumer holds that the engine does not, ``missing`` the engine's blocks the consumer
lacks; a state is exact when both are 0. :func:`extra_missing` judges one stream, :func:`extra_missing_keyed` a
router's whole state keyed by stream (``(worker, rank)``), where every block of a stream the truth does not know is
extra.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Set
from typing import NamedTuple, TypeVar

H = TypeVar("H", bound=Hashable)
K = TypeVar("K", bound=Hashable)


class ExtraMissing(NamedTuple):
    extra: int
    missing: int

    @property
    def exact(self) -> bool:
        return self.extra == 0 and self.missing == 0

    def __str__(self) -> str:
        return "exact" if self.exact else f"+{self.extra} -{self.missing}"


def extra_missing(got: Set[H], truth: Set[H]) -> ExtraMissing:
    """One stream's blocks against the truth."""
    return ExtraMissing(len(got - truth), len(truth - got))


def extra_missing_keyed(got: Mapping[K, Set[H]], truth: Mapping[K, Set[H]]) -> ExtraMissing:
    """Every stream's blocks against the truth; streams the truth does not have count as wholly extra."""
    empty: frozenset[H] = frozenset()
    extra = sum(len(got.get(k, empty) - t) for k, t in truth.items())
    extra += sum(len(v) for k, v in got.items() if k not in truth)
    missing = sum(len(t - got.get(k, empty)) for k, t in truth.items())
    return ExtraMissing(extra, missing)
