"""Children with bounded waits: every wait has a deadline, every child its own session (its group is ours)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any


class Timeout(Exception):
    """A bounded wait ran out."""


def wait_until(what: str, cond: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise Timeout(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def http_post(url: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e).encode()


# Every child this process started and has not reaped: the harness's finally kills what is left.
LIVE: dict[int, Proc] = {}


class Proc:
    """One child in its own session; output appended to ``log``, or (``pipes``) stdin/stdout ours for JSON lines."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 pipes: bool = False) -> None:
        self.name = name
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logf: IO[bytes] = open(log, "ab")
        self.popen = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else self._logf, stderr=self._logf,
            env=dict(env) if env is not None else None, start_new_session=True,
        )
        self.pid = self.popen.pid
        self._buf = b""
        LIVE[self.pid] = self

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the group and reap."""
        self.signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                f.close()
        self._logf.close()
        LIVE.pop(self.pid, None)

    def ask(self, cmd: dict[str, Any] | None, timeout: float = 60.0) -> dict[str, Any]:
        """Send one JSON line (None: send nothing) and read one JSON line back within ``timeout``."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        if cmd is not None:
            self.popen.stdin.write((json.dumps(cmd) + "\n").encode())
            self.popen.stdin.flush()
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


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
