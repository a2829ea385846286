"""A shared ``kvshmd serve`` for a harness: started with its flags, health-checked, signalled, stopped, restarted.

:class:`Kvshmd` owns one daemon in a work directory it is given: the socket (``<dir>/kvshmd.sock`` unless named),
the log (``<dir>/kvshmd.log``, appended across restarts; :meth:`Kvshmd.log_text` reads the current life's part) and,
by default, a private ``XDG_RUNTIME_DIR`` (``<dir>/xdg``, 0700) so the daemon's default paths stay inside the run.
``http`` is the ``--http`` address; port 0 (the default, ``127.0.0.1:0``) becomes a free port picked when the object
is made and kept across restarts; None runs without HTTP (health is then asked over the socket with kvshm's own
client).
``prefix`` is put before the binary (``ip netns exec NS``). Healthy means ``GET /healthz`` answers 200 (or the
socket's HEALTH answers) within the start timeout; a daemon that exits first raises ``RuntimeError`` with its log's
tail, one that never answers :class:`~kvshm_testkit.procs.Timeout` (it is SIGKILLed and reaped first).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from .net import free_port, http_get
from .procs import Proc, Timeout, proc_state, wait_until


class Kvshmd:
    """One ``kvshmd serve`` (see the module doc); lives end with :meth:`stop` or :meth:`kill`, :meth:`start` or
    :meth:`restart` begins the next with the same flags."""

    def __init__(self, binary: str | os.PathLike[str], workdir: Path, *, http: str | None = "127.0.0.1:0",
                 flags: Sequence[str] = (), socket: Path | None = None, log: Path | None = None,
                 prefix: Sequence[str] = (), env: Mapping[str, str] | None = None, runtime_dir: bool = True,
                 name: str = "kvshmd") -> None:
        self.binary = str(binary)
        self.dir = workdir
        self.socket = socket if socket is not None else workdir / "kvshmd.sock"
        self.log = log if log is not None else workdir / "kvshmd.log"
        self.flags = list(flags)
        self.prefix = list(prefix)
        self.name = name
        self._env = dict(env) if env is not None else None
        self._runtime_dir = runtime_dir
        if http is not None and http.endswith(":0"):
            host = http.rsplit(":", 1)[0]
            http = f"{host}:{free_port(host=host)}"
        # host:port of --http ("" without HTTP).
        self.http = http or ""
        self.proc: Proc | None = None
        self.starts = 0
        self._log_from = 0

    # --- addresses ---------------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """``http://<http address><path>`` (the daemon must run with HTTP)."""
        if not self.http:
            raise ValueError(f"{self.name}: runs without HTTP (http=None)")
        return f"http://{self.http}{path}"

    @property
    def metrics_url(self) -> str:
        return self.url("/metrics")

    @property
    def healthz_url(self) -> str:
        return self.url("/healthz")

    def argv(self) -> list[str]:
        """The command line of the next start."""
        argv = [*self.prefix, self.binary, "serve", "--socket", str(self.socket)]
        if self.http:
            argv += ["--http", self.http]
        return argv + self.flags

    # --- life --------------------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name}: not started")
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> Kvshmd:
        """Start the next life and wait until it is healthy (see the module doc)."""
        if self.proc is not None and self.proc.alive():
            raise RuntimeError(f"{self.name}: already running (pid {self.proc.pid})")
        self.dir.mkdir(parents=True, exist_ok=True)
        env = dict(self._env if self._env is not None else os.environ)
        if self._runtime_dir:
            xdg = self.dir / "xdg"
            xdg.mkdir(mode=0o700, exist_ok=True)
            env["XDG_RUNTIME_DIR"] = str(xdg)
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        self.proc = Proc(self.name, self.argv(), self.log, env=env)
        self.starts += 1
        try:
            wait_until(f"{self.name} healthy", self._up, timeout, interval=0.02)
        except BaseException:
            self.proc.kill()  # a daemon that did not come up is not left behind
            raise
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            text = self.log_text()
            tail = text if len(text) <= 2500 else f"{text[:500]} [...] {text[-2000:]}"
            raise RuntimeError(f"{self.name} exited {self.proc.returncode} at start: {tail}")
        if not self.http:
            return self._socket_healthy()
        return http_get(self.healthz_url, 1.0).status == 200

    def _socket_healthy(self) -> bool:
        from kvshm._client import Client, ClientError

        try:
            with Client(str(self.socket), connect_timeout=1.0, timeout=1.0) as c:
                c.health()
            return True
        except (ClientError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the daemon (by its pid)."""
        if self.proc is not None:
            self.proc.send(sig)

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, and wait until the kernel shows the daemon stopped (a signal is delivered asynchronously)."""
        self.send(signal.SIGSTOP)
        wait_until(f"{self.name} stopped", lambda: proc_state(self.pid) in ("T", ""), timeout, interval=0.005)

    def resume(self, timeout: float = 5.0) -> None:
        """SIGCONT, and wait until the daemon runs again."""
        self.send(signal.SIGCONT)
        wait_until(f"{self.name} resumed", lambda: proc_state(self.pid) != "T", timeout, interval=0.005)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (after a SIGCONT, in case it is paused) and wait ``timeout`` s: the exit status, or None when it
        had to be SIGKILLed (or was never started)."""
        p = self.proc
        if p is None:
            return None
        if p.alive():
            p.send(signal.SIGCONT)
            p.send(signal.SIGTERM)
        rc = p.wait(timeout)
        if rc is None:
            p.kill()
        else:
            p.reap()
        return rc

    def kill(self) -> None:
        """SIGKILL (the fault) and reap."""
        if self.proc is not None:
            self.proc.kill()

    def restart(self, timeout: float = 20.0) -> Kvshmd:
        """Stop this life (SIGTERM) if it runs, then start the next."""
        if self.alive():
            self.stop()
        return self.start(timeout)

    def log_text(self) -> str:
        """This life's part of the log."""
        if self.proc is not None:
            return self.proc.log_text(self._log_from)
        return ""

    # --- context manager: started on entry, stopped on exit -----------------------------------------------
    def __enter__(self) -> Kvshmd:
        if not self.alive():
            self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["Kvshmd", "Timeout"]
