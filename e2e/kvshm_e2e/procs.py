"""Child processes with bounded waits: every wait here has a deadline, every process its own session."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO


class Timeout(Exception):
    """A bounded wait ran out."""


def wait_until(what: str, cond: Callable[[], bool], timeout: float, interval: float = 0.2) -> None:
    """Poll ``cond`` until it holds; :class:`Timeout` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() >= deadline:
            raise Timeout(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """GET ``url``: (status, headers, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()
    except (urllib.error.URLError, OSError):
        return 0, {}, b""


def http_post(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e).encode()


class Proc:
    """One child in its own session (so its process group is ours to signal), output appended to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logf: IO[bytes] = open(log, "ab")
        self.popen = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=self._logf, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_alive(self) -> bool:
        """Whether any process of the child's process group is left."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # Zombies of the group count as gone once the leader is reaped.
        self.popen.poll()
        return _group_has_live_members(self.pid)

    def send(self, sig: signal.Signals, group: bool = False) -> None:
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, sig: signal.Signals, timeout: float, group: bool = False) -> bool:
        """Send ``sig`` and wait for the whole group to be gone; SIGKILL the group after ``timeout``.
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
        try:
            self.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self._logf.close()
        return clean


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
