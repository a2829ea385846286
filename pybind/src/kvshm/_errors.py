"""kvshm's public exceptions (re-exported by :mod:`kvshm`)."""

from __future__ import annotations

__all__ = ["ClosedError", "ForkedProcessError", "KvshmError", "LauncherError"]


class KvshmError(RuntimeError):
    """Base class of kvshm's public errors. Never raised for a full ring or a missing daemon."""


class ClosedError(KvshmError):
    """The LocalIndexer was shut down."""


class ForkedProcessError(KvshmError):
    """A LocalIndexer was used in a process forked from the one that created it."""


class LauncherError(KvshmError):
    """kvshmd could not be found, or a private kvshmd did not start (the message carries its output)."""
