"""Ring files left behind by producers that died: how kvshm names its ring files, and the sweep that removes the
stale ones (the LocalIndexer runs it on its ring directory before creating a ring)."""

from __future__ import annotations

import fcntl
import logging
import os
import re
from typing import Final

from kvshm._layout import IDENTITY, MAGIC
from kvshm._proc import process_running

log = logging.getLogger("kvshm")

__all__ = ["ring_file_name", "sweep_stale_rings"]

# Ring files kvshm names (ring_file_name): kvshm-w<worker_id>-<pid>-<epoch>.ring.
_RING_NAME: Final = re.compile(r"kvshm-w\d+-(\d+)-\d+\.ring")


def ring_file_name(worker_id: int, pid: int, epoch: int) -> str:
    """The file name RingWriter.create gives a ring by default (sweep_stale_rings only considers such names)."""
    return f"kvshm-w{worker_id}-{pid}-{epoch}.ring"


def sweep_stale_rings(directory: str) -> list[str]:
    """Remove ring files (``kvshm-w<worker>-<pid>-<epoch>.ring``, ours) whose producer is gone, return their paths.

    A file is stale when its header is complete (magic written), its producer process no longer runs (pid gone or
    reused: start time differs) and nobody holds its flock (a live RingWriter always does). Unlinking is safe for a
    daemon still draining it: its mapping outlives the name. Best effort: errors skip the file.
    """
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        if not _RING_NAME.fullmatch(name):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != uid or not (st.st_mode & 0o170000 == 0o100000):
                continue
            header = os.pread(fd, IDENTITY.size, 0)
            if len(header) < IDENTITY.size:
                continue
            magic, pid, _, start = IDENTITY.unpack(header)
            if magic != MAGIC or process_running(pid, start):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live producer holds it
            os.unlink(path)
            removed.append(path)
            log.info("kvshm: removed the stale ring %s of dead producer pid %d", path, pid)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed
