"""Child processes with bounded waits: every wait has a deadline, every child its own session (its group is ours).

:class:`Proc` runs one child with its output appended to a log file, or (``pipes=True``) with stdin/stdout ours
for JSON lines (:meth:`Proc.ask`). :func:`wait_until` polls a condition until a deadline and raises
:class:`Timeout` naming what it waited for. Every child started and not yet reaped is in :data:`LIVE`, so a
harness's ``finally`` can :func:`kill_live` what is left; nothing here signals a process it did not start.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


class Timeout(Exception):
    """A bounded wait ran out."""


def wait_until(what: str, cond: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    """Poll ``cond`` every ``interval`` s until it holds; :class:`Timeout` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise Timeout(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


# Every child started here and not reaped yet, by pid.
LIVE: dict[int, Proc] = {}


class Proc:
    """One child in its own session (its process group is ours to signal); stdout and stderr appended to ``log``,
    or with ``pipes`` stdin/stdout ours for JSON lines (:meth:`ask`) and only stderr in ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, pipes: bool = False) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logf: IO[bytes] = open(log, "ab")  # noqa: SIM115 - closed when the child is reaped
        self.popen = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else self._logf, stderr=self._logf,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
        )
        self.pid = self.popen.pid
        self._buf = b""
        LIVE[self.pid] = self

    @property
    def returncode(self) -> int | None:
        """The exit status (negative: the signal), None while it runs."""
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of the child's process group is left (zombies count as gone)."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        self.popen.poll()  # reap the leader, so its zombie does not count
        return _group_has_live_members(self.pid)

    def send(self, sig: signal.Signals, group: bool = False) -> None:
        """Send ``sig`` to the child (``group``: to its whole process group); a child already gone is no error."""
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for the child to exit: its status, or None when it still runs."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: signal.Signals, timeout: float, group: bool = False) -> bool:
        """Send ``sig`` and wait for the whole group to be gone; SIGKILL the group after ``timeout`` and reap.
        Returns whether it went by itself."""
        self.send(sig, group)
        try:
            wait_until(f"{self.name} exits", lambda: not self.group_alive(), timeout)
            clean = True
        except Timeout:
            clean = False
            self.send(signal.SIGKILL, group=True)
            try:
                wait_until(f"{self.name} killed", lambda: not self.group_alive(), 10.0)
            except Timeout:
                pass
        self.reap()
        return clean

    def kill(self) -> None:
        """SIGKILL the group and reap."""
        self.send(signal.SIGKILL, group=True)
        self.reap()

    def reap(self) -> None:
        """Wait (at most 10 s) for the child to exit, then release its log, pipes and :data:`LIVE` entry."""
        self.wait(10.0)
        self._logf.close()
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        LIVE.pop(self.pid, None)

    def ask(self, cmd: dict[str, Any] | None, timeout: float = 60.0) -> dict[str, Any]:
        """Send one JSON line (None: send nothing) and read one JSON line back within ``timeout`` s (``pipes``
        only). :class:`Timeout` when no line comes, RuntimeError when the child exits first."""
        assert self.popen.stdin is not None and self.popen.stdout is not None, "ask needs Proc(..., pipes=True)"
        if cmd is not None:
            try:
                self.popen.stdin.write((json.dumps(cmd) + "\n").encode())
                self.popen.stdin.flush()
            except BrokenPipeError as e:
                raise RuntimeError(f"{self.name}: exited (rc {self.popen.wait(10.0)}) before {cmd}") from e
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{self.name}: no reply to {cmd} within {timeout:.0f} s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"{self.name}: exited (rc {self.popen.poll()}) before replying to {cmd}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        out: dict[str, Any] = json.loads(line)
        return out

    def log_text(self, since: int = 0) -> str:
        """The log from byte ``since`` on, decoded (bad bytes replaced)."""
        if not self._logf.closed:
            self._logf.flush()
        try:
            with open(self.log, "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def kill_live() -> None:
    """SIGKILL and reap every child in :data:`LIVE` (a harness's ``finally``)."""
    for p in list(LIVE.values()):
        p.kill()


def _group_has_live_members(pgid: int) -> bool:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[2] the pgid.
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from /proc/PID/stat, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc/PID/stat (``R``, ``S``, ``T`` stopped, ``Z``...); "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of ``pid`` in bytes from /proc/PID/status: ``VmRSS`` (everything resident, shared-memory
    rings included) or ``RssAnon`` (its heap); 0 when the process or the field is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
