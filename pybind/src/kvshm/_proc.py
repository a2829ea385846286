"""``/proc/<pid>/stat``: which process runs under a pid, and since when (kvshm's one parser of it in Python; Go's is
shm.ReadProcStat). The ring header names its producer by pid and start time (field 22), so a recycled pid is never
taken for the producer."""

from __future__ import annotations

import os

__all__ = ["proc_stat", "process_running", "start_time"]


def proc_stat(pid: int | str = "self") -> tuple[bytes, int] | None:
    """``(state, start_time)`` of ``/proc/<pid>/stat``: field 3 (the state letter, e.g. ``b"Z"`` for a zombie) and
    field 22 (start time, clock ticks since boot, what the ring header's ``producer_start_time`` holds). ``None``
    when the process does not exist; other ``OSError``s propagate. The command name (field 2) may contain spaces and
    parentheses, so fields are counted after the last ``)``.

    The own process's is read through its main thread, ``/proc/self/task/<pid>/stat``: the same start time, and a
    path a user-mode emulator leaves to the kernel (qemu-user answers ``/proc/self/stat`` itself, with a start time
    of its own that kvshmd, reading the kernel's, would take for another process)."""
    own = os.getpid()
    path = f"/proc/self/task/{own}/stat" if pid in ("self", own) else f"/proc/{pid}/stat"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    fields = raw[raw.rindex(b")") + 1 :].split()
    return fields[0], int(fields[19])


def start_time() -> int:
    """Field 22 of /proc/self/stat (clock ticks since boot); 0 where /proc is missing."""
    try:
        st = proc_stat()
    except OSError:
        return 0
    return 0 if st is None else st[1]


def process_running(pid: int, start: int) -> bool:
    """Whether ``pid`` runs and (when ``start`` is known, nonzero) is the process that started at that time. A zombie
    (or dead) process does not run; when /proc cannot tell, the answer is True (the caller keeps what may be alive)."""
    if pid <= 0:
        return False
    try:
        st = proc_stat(pid)
    except OSError:
        return True
    if st is None or st[0] in (b"Z", b"X"):
        return False
    return start == 0 or st[1] == start
