"""Finding and running a private kvshmd.

:func:`find_kvshmd` looks for the daemon binary in this order: the ``KVSHMD_BIN`` environment variable, the
static binary shipped in the wheel (``kvshm/_bin/kvshmd``), then ``PATH``.

A :class:`PrivateDaemon` is a kvshmd owned by one Python process. It lives in a private directory made with
:func:`tempfile.mkdtemp` (``$TMPDIR/kvshm-<pid>-XXXX``, mode 0700, so no other user can reach its socket) holding
``kvshmd.sock`` and ``kvshmd.log`` (the daemon's stdout and stderr). It is started as::

    kvshmd serve --socket DIR/kvshmd.sock --parent-pid <this process's pid> --cleanup-dir DIR --cleanup-token T \
        --state-dir DIR/state --checkpoint-interval 10s      # $KVSHM_CHECKPOINT_INTERVAL overrides 10s

``T`` is a random token also written to ``DIR/kvshmd.cleanup-token`` (0600): kvshmd deletes DIR only when the file
there holds the token it was given, so it deletes nothing it did not get from this launcher.

**detached**: ``/bin/sh`` started in a new session forks a waiter subshell, which starts kvshmd, writes its pid to
a pipe, waits for it and writes its exit status to the same pipe; the first shell exits at once, so the waiter and
kvshmd are reparented away from this process. Neither is this process's child or descendant: vLLM's shutdown, which
SIGKILLs every descendant of the engine (``force killing sub process``), never kills kvshmd before its final drain,
and a Ctrl-C or SIGKILL aimed at the engine's process group does not reach it. kvshmd follows this process instead
(``--parent-pid``): when it is gone the daemon drains every ring, publishes the end of the incarnation, removes DIR
(``--cleanup-dir``) and exits, so nothing is left behind. The pipe is this process's view of the daemon: its pid
(signals go through a pidfd where the kernel has them, so a recycled pid is never signalled), whether it still runs
(the pipe stays silent until it exits) and its exit status. :meth:`PrivateDaemon.start` returns only once the daemon
answers HEALTH, or raises :class:`LauncherError` carrying the tail of the daemon's log and its exit status.
:meth:`PrivateDaemon.stop` sends SIGTERM (the daemon drains and exits), escalates to SIGKILL after a grace period,
and removes the directory. A kvshmd without ``--cleanup-dir`` or ``--cleanup-token`` (an older binary) is started
again without them (logged once); the directory is then removed by :meth:`PrivateDaemon.stop`, or, after a
SIGKILLed engine, by the next PrivateDaemon (:func:`sweep_stale_dirs`). ``--state-dir``/``--checkpoint-interval`` make
the daemon checkpoint its index every 10 s while records arrive (``$KVSHM_CHECKPOINT_INTERVAL``, a Go duration,
overrides it; ``0`` turns it off) and whenever they fill half the ring, and hand ring space back to this process only up
to a checkpoint on disk, so a private daemon that crashes and is restarted by the client restores the checkpoint and
replays the ring: nothing is lost (the price: up to half the ring holds records already applied, so a dead daemon is
absorbed by less ring before events are dropped). The environment is passed through, so ``KVSHMD_*`` variables
(for example ``KVSHMD_HTTP``) configure the private daemon too, except those of the flags above, which win.

Not thread-safe: the owner serializes start/stop/restart (LocalIndexer does it under its supervisor lock).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, NoReturn

from ._client import Client, ClientError
from ._errors import LauncherError

__all__ = ["PrivateDaemon", "find_kvshmd", "sweep_stale_dirs"]

log = logging.getLogger("kvshm")

BIN_ENV: Final = "KVSHMD_BIN"
SOCKET_NAME: Final = "kvshmd.sock"
STATE_NAME: Final = "state"  # the daemon's --state-dir inside the private directory (it creates it 0700)
# 10 s: a checkpoint costs ~53 bytes and ~0.2 us per resident block (a 250k-block cache: ~13 MB, ~50 ms of
# paused applying), so a few per minute keep the cost negligible; the half-ring trigger bounds the replay anyway.
CHECKPOINT_INTERVAL_ENV: Final = "KVSHM_CHECKPOINT_INTERVAL"
DEFAULT_CHECKPOINT_INTERVAL: Final = "10s"
LOG_NAME: Final = "kvshmd.log"
TOKEN_NAME: Final = "kvshmd.cleanup-token"  # kvshmd's daemon.CleanupTokenFile: proves DIR is for --cleanup-dir
_LOG_TAIL_BYTES: Final = 4000
_STALE_DIR_AGE: Final = 60.0  # seconds a dead process's daemon directory is left alone
_KILL_WAIT: Final = 5.0  # seconds to wait for a SIGKILLed daemon's exit to be reported


def packaged_kvshmd() -> Path:
    """Path where the wheel ships the static kvshmd (may not exist in a source checkout)."""
    return Path(__file__).resolve().parent / "_bin" / "kvshmd"


def find_kvshmd() -> str:
    """Return the kvshmd binary to run: ``$KVSHMD_BIN``, else the packaged binary, else ``kvshmd`` on PATH."""
    env = os.environ.get(BIN_ENV)
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise LauncherError(f"kvshm: {BIN_ENV}={env!r} is not an executable file")
        return env
    packaged = packaged_kvshmd()
    if packaged.is_file() and os.access(packaged, os.X_OK):
        return str(packaged)
    found = shutil.which("kvshmd")
    if found:
        return found
    if packaged.is_file():
        raise LauncherError(f"kvshm: the packaged {packaged} is not executable (chmod +x it, or set {BIN_ENV})")
    raise LauncherError(
        f"kvshm: cannot find kvshmd: set {BIN_ENV}, install the kvshm wheel (it ships {packaged}), "
        "or put kvshmd on PATH"
    )


def exec_kvshmd() -> NoReturn:
    """The ``kvshmd`` console command of the wheel: replaces this process with the packaged daemon binary (or
    ``$KVSHMD_BIN``) run with the same arguments, so ``kvshmd serve``/``stats``/... work after ``pip install``."""
    binary = os.environ.get(BIN_ENV) or str(packaged_kvshmd())
    if os.path.realpath(binary) == os.path.realpath(sys.argv[0]):
        sys.exit(f"kvshm: {BIN_ENV}={binary!r} points at this wrapper script, not at the kvshmd binary")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit(f"kvshm: {binary} is not an executable kvshmd (reinstall the kvshm wheel or set {BIN_ENV})")
    os.execv(binary, [binary, *sys.argv[1:]])


_DIR_NAME: Final = re.compile(r"kvshm-(\d+)-[^/]+")


def sweep_stale_dirs(min_age: float = _STALE_DIR_AGE) -> list[str]:
    """Remove private daemon directories (``$TMPDIR/kvshm-<pid>-*``, ours) that a SIGKILLed engine left behind (its
    daemon exits by itself through --parent-pid). A directory is stale when its creating pid does not run here,
    nothing listens on its socket (a /tmp shared with another pid namespace may hold a live one) and it has not
    changed for ``min_age`` seconds (a daemon being started). Returns the removed paths."""
    removed: list[str] = []
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    uid = os.getuid()
    now = time.time()
    for name in names:
        m = _DIR_NAME.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if (st.st_uid != uid or not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < min_age
                or os.path.exists(f"/proc/{m.group(1)}") or _listening(os.path.join(path, SOCKET_NAME))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _listening(path: str) -> bool:
    """Whether a daemon accepts connections on the Unix socket ``path``."""
    if not os.path.exists(path):
        return False
    client = Client(path, connect_timeout=0.5)
    try:
        client.connect()
        return True
    except ClientError:
        return False
    finally:
        client.close()


# The detaching launcher: $0 and $@ are kvshmd's argv. fd 3 is the pipe to this process (pid, then exit status);
# kvshmd gets fd 1 and 2 on the log and no fd 3. The outer shell exits as soon as the waiter is forked.
_SPAWN: Final = """exec 3>&1 1>&2 </dev/null
(
  "$0" "$@" 3>&- &
  echo "$!" >&3
  wait "$!"
  echo "$?" >&3
) &
"""
# An older kvshmd without --cleanup-dir, or with it but without --cleanup-token.
_UNKNOWN_FLAG: Final = re.compile(r"flag provided but not defined: -cleanup-(dir|token)")
_NO_CLEANUP_FLAG: set[str] = set()  # kvshmd binaries that refused --cleanup-dir (asked once per process)


class _Exit(Exception):
    """The daemon's exit seen on the pipe (status None: the waiter died without saying)."""

    def __init__(self, status: int | None) -> None:
        super().__init__(status)
        self.status = status


class _Detached:
    """One detached kvshmd, seen through its waiter's pipe (module docstring)."""

    def __init__(self, argv: list[str], log: int, timeout: float) -> None:
        try:
            sh = subprocess.Popen(
                ["/bin/sh", "-c", _SPAWN, *argv],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, close_fds=True, start_new_session=True,
            )
        except OSError as e:
            raise LauncherError(f"kvshm: cannot start /bin/sh to launch {argv[0]}: {e.strerror or e}") from e
        assert sh.stdout is not None
        self._fd = os.dup(sh.stdout.fileno())  # non-inheritable: no other child of this process holds it
        sh.stdout.close()
        sh.wait()  # exits once the waiter is forked
        os.set_blocking(self._fd, False)
        self._buf = b""
        self._eof = False
        self.status: int | None = None
        self.exited = False
        self.pidfd = -1
        line = self._line(timeout)
        if line is None or not line.strip().isdigit():
            self.close()
            raise LauncherError(f"kvshm: the launcher shell gave no pid for {argv[0]} (exit status {sh.returncode})")
        self.pid = int(line)
        try:  # before anything could reap it: the waiter reaps kvshmd only after it exited
            self.pidfd = os.pidfd_open(self.pid) if hasattr(os, "pidfd_open") else -1
        except OSError:
            self.pidfd = -1  # exited already (its status follows), or no pidfd in this kernel

    def _line(self, timeout: float) -> str | None:
        """The next line from the waiter within ``timeout`` (0: only what is there), or None."""
        deadline = time.monotonic() + timeout
        poller = select.poll()  # not select(): an engine may hold more than FD_SETSIZE descriptors
        poller.register(self._fd, select.POLLIN)
        while b"\n" not in self._buf and not self._eof:
            left = max(0.0, deadline - time.monotonic())
            if not poller.poll(int(left * 1000)):
                return None
            try:
                chunk = os.read(self._fd, 64)
            except BlockingIOError:
                continue
            if not chunk:
                self._eof = True
            self._buf += chunk
        if b"\n" not in self._buf:
            return None
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("ascii", "replace")

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether kvshmd has exited (waiting up to ``timeout`` for it); sets ``status`` (Popen's convention:
        negative is the signal that killed it, None when unknown)."""
        if self.exited:
            return True
        line = self._line(timeout)
        if line is None and not self._eof:
            return False
        self.exited = True
        if line is not None and line.strip().isdigit():
            code = int(line)
            self.status = -(code - 128) if code > 128 else code  # sh reports a signal as 128 + its number
        self.close()
        return True

    def signal(self, sig: int) -> None:
        """Send ``sig`` to kvshmd unless it is known to have exited."""
        if self.poll():
            return
        try:
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for fd in (self._fd, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self.pidfd = -1
        self._eof = True


class PrivateDaemon:
    """A kvshmd started by, and tied to, this process (see the module docstring)."""

    def __init__(self, binary: str | None = None, *, ready_timeout: float = 10.0, stop_timeout: float = 5.0) -> None:
        self.binary = binary if binary is not None else find_kvshmd()
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        sweep_stale_dirs()
        self.dir = tempfile.mkdtemp(prefix=f"kvshm-{os.getpid()}-")  # 0700, owned by us
        self.socket_path = os.path.join(self.dir, SOCKET_NAME)
        self.log_path = os.path.join(self.dir, LOG_NAME)
        self._token = secrets.token_hex(16)  # --cleanup-token, also in DIR/TOKEN_NAME
        self.owner_pid = os.getpid()
        self.starts = 0
        self.cleanup_flag = self.binary not in _NO_CLEANUP_FLAG  # pass --cleanup-dir (False: this kvshmd refused it)
        self._stopped = False  # set by stop(); start() refuses afterwards (stop may race with a restart)
        self._proc: _Detached | None = None
        self._last_status: int | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the daemon process, if one was started and has not been seen to exit."""
        return None if self._proc is None or self._proc.exited else self._proc.pid

    def alive(self) -> bool:
        """Whether the daemon process is running."""
        return self._proc is not None and not self._proc.poll()

    def returncode(self) -> int | None:
        """Exit status of the last daemon process (negative: killed by that signal), None while it runs (or
        unknown)."""
        if self._proc is None:
            return self._last_status
        return self._proc.status if self._proc.poll() else None

    def argv(self) -> list[str]:
        """The daemon's command line."""
        argv = [self.binary, "serve", "--socket", self.socket_path, "--parent-pid", str(self.owner_pid)]
        if self.cleanup_flag:
            argv += ["--cleanup-dir", self.dir, "--cleanup-token", self._token]
        return argv + [
            "--state-dir", os.path.join(self.dir, STATE_NAME), "--checkpoint-interval",
            os.environ.get(CHECKPOINT_INTERVAL_ENV) or DEFAULT_CHECKPOINT_INTERVAL,
        ]

    def start(self) -> None:
        """Start the daemon (killing a previous one) and wait until it answers HEALTH; raises LauncherError."""
        try:
            self._start()
        except _Exit:
            # An older kvshmd without --cleanup-dir or --cleanup-token: once more without them (stop() removes the
            # directory then).
            self.cleanup_flag = False
            _NO_CLEANUP_FLAG.add(self.binary)
            log.warning("kvshm: %s has no --cleanup-dir; a SIGKILLed engine's daemon directory is removed by the "
                        "next engine's kvshm", self.binary)
            self._start()

    def _start(self) -> None:
        if self._stopped:
            raise LauncherError("kvshm: the private kvshmd was stopped")
        if self._proc is not None:
            self._kill()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)  # a /tmp cleaner may have removed it
        self._write_token()
        try:
            os.unlink(self.socket_path)  # stale socket of a dead daemon
        except FileNotFoundError:
            pass
        with open(self.log_path, "ab") as log_file:
            log_offset = log_file.tell()
            self._proc = _Detached(self.argv(), log_file.fileno(), self.ready_timeout)
        self.starts += 1
        self._wait_ready(log_offset)

    def _write_token(self) -> None:
        """Write the cleanup token into the private directory (0600, never through a symlink)."""
        fd = os.open(os.path.join(self.dir, TOKEN_NAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (self._token + "\n").encode("ascii"))
        finally:
            os.close(fd)

    def _wait_ready(self, log_offset: int) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.002
        last_error = "no answer yet"
        while True:
            if self._stopped:  # stop() ran meanwhile (it may not have seen this process)
                self._kill(proc)
                raise LauncherError("kvshm: the private kvshmd was stopped while starting")
            if proc.poll():
                self._proc = None
                self._last_status = proc.status
                tail = self._log_tail(log_offset)
                if self.cleanup_flag and _UNKNOWN_FLAG.search(self._log_head(log_offset)):
                    raise _Exit(proc.status)
                raise LauncherError(
                    f"kvshm: kvshmd exited with status {proc.status} before becoming ready; its output:\n" + tail
                )
            if os.path.exists(self.socket_path):
                client = Client(self.socket_path, connect_timeout=1.0, timeout=2.0)
                try:
                    reply = client.health()
                    if reply.get("status") == "ok":
                        return
                    last_error = f"HEALTH answered {reply!r}"
                except ClientError as e:
                    last_error = str(e)
                finally:
                    client.close()
            if time.monotonic() >= deadline:
                self._kill(proc)
                raise LauncherError(
                    f"kvshm: kvshmd did not answer HEALTH on {self.socket_path} within {self.ready_timeout:g} s "
                    f"({last_error}); its output:\n" + self._log_tail(log_offset)
                )
            proc.poll(delay)  # returns early if it exits
            delay = min(delay * 2, 0.05)

    def _log_head(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read(_LOG_TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""

    def _log_tail(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                f.seek(max(offset, end - _LOG_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace").strip()
        except OSError as e:
            return f"(cannot read {self.log_path}: {e})"
        return text or "(no output)"

    def _kill(self, proc: _Detached | None = None) -> None:
        """SIGKILL the daemon and wait (bounded) until its waiter reports the exit."""
        if proc is None:
            proc = self._proc
        if proc is self._proc:
            self._proc = None
        if proc is None:
            return
        proc.signal(signal.SIGKILL)
        proc.poll(_KILL_WAIT)
        self._last_status = proc.status
        proc.close()

    def stop(self) -> None:
        """SIGTERM the daemon (it drains and exits), SIGKILL after ``stop_timeout``, remove the directory.

        Idempotent. Does nothing in a forked child (the daemon belongs to the parent).
        """
        if os.getpid() != self.owner_pid:
            return
        self._stopped = True
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.signal(signal.SIGTERM)
            if not proc.poll(self.stop_timeout):
                self._kill(proc)
            self._last_status = proc.status
            proc.close()
        shutil.rmtree(self.dir, ignore_errors=True)
