"""The lifecycle steps, run for each publisher / daemon mode against one router registered once.

Each mode gets its own ports, router, (shared) kvshmd and engine, and runs the steps in order; after each step the
router's and kvshmd's state are polled against the truth for up to :data:`~.table.CONVERGE_TIMEOUT` seconds.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvshm_testkit import Kvshmd, extra_missing, wait_until

from . import truth
from .engine import Engine, Ports
from .judges import KvshmdJudge, Router, State, WireRecorder
from .sglang import SGLangEngine
from .table import CONVERGE_TIMEOUT, Check, Judged, Mode, Row

WORKER_ID = 7
REQUESTS = 100
FEW_REQUESTS = 4
FORCE_KILL_LINE = "force killing sub process kvshmd"  # vLLM's log line when its shutdown SIGKILLs a child
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
PRIVATE_EXIT_TIMEOUT = 10.0  # a private kvshmd drains and exits after its engine is gone


@dataclass(frozen=True)
class Setup:
    """What every mode shares: the model, the router binary, the kvshmd binary, where logs go."""

    model: Path
    router_bin: Path
    kvshmd_bin: Path
    out: Path
    base_port: int


class ModeRun:
    """One mode's processes and judges."""

    def __init__(self, setup: Setup, mode: Mode, index: int) -> None:
        self.setup = setup
        self.mode = mode
        self.dir = setup.out / mode.name.replace(" ", "-")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        base = setup.base_port + 10 * index
        self.ports = Ports(http=base, pub=base + 1, replay=base + 2)
        self.router = Router(setup.router_bin, base + 3, self.dir / "router.log")
        self.kvshmd_http = f"127.0.0.1:{base + 4}"
        self.tmp = self.dir / "tmp"  # the engine's TMPDIR: where a private kvshmd's directory lives
        self.tmp.mkdir()
        self.truth_path = self.dir / "truth.json"
        # The shared daemon (XDG_RUNTIME_DIR inside this run, so kvshmd's default paths stay in it).
        self.daemon = Kvshmd(setup.kvshmd_bin, self.dir, http=self.kvshmd_http)
        self.socket = self.daemon.socket
        self.rng = random.Random(16)
        env = dict(os.environ)
        env.update({
            truth.TRUTH_ENV: str(self.truth_path), "TMPDIR": str(self.tmp),
            "KVSHM_WORKER_ID": str(WORKER_ID),
            # No KVSHM_KV_BLOCK_SIZE: the plugin must read the block size from vLLM's own config.
            "VLLM_CPU_KVCACHE_SPACE": "1",
        })
        if mode.daemon == "shared":
            env["KVSHM_SOCKET"] = str(self.socket)
        elif mode.daemon == "private":
            env["KVSHMD_HTTP"] = self.kvshmd_http  # passed through to the private kvshmd (pybind's launcher)
        engine = SGLangEngine if mode.engine == "sglang" else Engine
        self.engine = engine(setup.model, self.ports, mode.publisher, env, self.dir)
        self.engine_name = ENGINE_NAMES[mode.engine]
        self.kvshmd = KvshmdJudge(self.kvshmd_http) if mode.daemon != "none" else None
        self.wire = WireRecorder(f"tcp://127.0.0.1:{self.ports.pub}")
        self.rows: list[Row] = []
        self.checks: list[Check] = []

    # --- processes ---------------------------------------------------------------------------------------

    def start_daemon(self) -> None:
        self.daemon.start(20.0)
        self.wire.incarnation(f"kvshmd {self.daemon.starts}")

    def start_engine(self) -> None:
        self.truth_path.unlink(missing_ok=True)
        self.wire.incarnation(f"engine {self.engine.incarnation + 1}")
        self.engine.start()

    def register(self) -> None:
        self.router.register(WORKER_ID, f"tcp://127.0.0.1:{self.ports.pub}",
                             f"tcp://127.0.0.1:{self.ports.replay}", self.engine.block_size)

    def restart_router(self) -> None:
        self.router.kill()
        self.router.start()
        self.register()

    # --- judging -----------------------------------------------------------------------------------------

    def current_truth(self) -> truth.Truth:
        return truth.read(self.truth_path) if self.engine.proc is not None else truth.EMPTY

    def judge(self, step: str, notes: list[str] | None = None, action: float = 0.0) -> Row:
        """Polls until the router and kvshmd match the truth, or CONVERGE_TIMEOUT; the last comparison is the row."""
        start = time.monotonic()
        while True:
            t = self.current_truth()
            r_state = self.router.state(WORKER_ID)
            k_state = self.kvshmd.state(WORKER_ID) if self.kvshmd is not None else None
            router = _judged(r_state, t.hashes)
            kvshmd = _judged(k_state, t.hashes) if k_state is not None else None
            elapsed = time.monotonic() - start
            if router.exact and (kvshmd is None or kvshmd.exact) and t == self.current_truth():
                row = Row(step, self.mode, len(t.hashes), router, kvshmd, elapsed, list(notes or []), action)
                break
            if elapsed >= CONVERGE_TIMEOUT:
                row = Row(step, self.mode, len(t.hashes), router, kvshmd, None, list(notes or []), action)
                break
            time.sleep(0.5)
        self.rows.append(row)
        print(f"  {step} ({action:.0f} s): truth {row.truth}, router {router.cell()}, "
              f"kvshmd {kvshmd.cell() if kvshmd else 'n/a'}", flush=True)
        for line in self.router.warnings():
            print(f"    router: {line}", flush=True)
        return row

    def after_engine_death(self, how: str) -> list[str]:
        """The private daemon's goals after its engine is gone: it was not SIGKILLed by vLLM, it left nothing (a
        SIGKILLed kvshmd leaves its directory: for SGLang, whose shutdown SIGKILLs its process tree without a log line
        naming the child, that check is the one)."""
        if self.mode.daemon != "private":
            return []
        notes: list[str] = []
        if "SIGTERM" in how and self.mode.engine == "vllm":  # vLLM's own shutdown; a group SIGKILL leaves it no say
            log = self.engine.log.read_text(errors="replace") if self.engine.log.exists() else ""
            forced = FORCE_KILL_LINE in log
            self.checks.append(Check(f"{how}: vLLM did not SIGKILL kvshmd", self.mode, not forced,
                                     f"'{FORCE_KILL_LINE}' in vLLM's log" if forced else "not in vLLM's log"))
        left: list[str] = []

        def clean() -> bool:
            left[:] = sorted(p.name for p in self.tmp.glob("kvshm-*"))
            return not left

        try:
            wait_until("private dir removed", clean, PRIVATE_EXIT_TIMEOUT, 0.5)
        except Exception:
            pass
        self.checks.append(Check(f"{how}: private dir removed", self.mode, not left,
                                 f"left in TMPDIR: {', '.join(left)}" if left else "nothing left"))
        shutil.rmtree(self.tmp, ignore_errors=True)  # the next incarnation starts clean either way
        self.tmp.mkdir(exist_ok=True)
        return notes

    # --- the steps ---------------------------------------------------------------------------------------

    def run(self) -> None:
        steps: list[tuple[str, Callable[[], list[str]]]] = [
            (f"steady serving, {REQUESTS} requests (evictions)", self.steady),
            ("SIGKILL, engine down", self.sigkill),
            (f"restarted on the same worker + {REQUESTS} requests", self.restart_with_requests),
            ("SIGTERM, engine down", self.sigterm),
            (f"restarted after SIGTERM + {REQUESTS} requests", self.restart_with_requests),
            ("router restarted, engine idle", self.router_idle),
            (f"router restarted + {FEW_REQUESTS} requests", self.router_busy),
            ("/flush_cache", self.flush_cache),
            (f"after /flush_cache + {FEW_REQUESTS} requests", self.after_flush),
            ("shared kvshmd SIGKILLed and restarted", self.kvshmd_restart),
            (f"after the kvshmd restart + {FEW_REQUESTS} requests", self.few_requests),
        ]
        print(f"== {self.mode.name}", flush=True)
        try:
            for name, action in steps:
                if action in (self.kvshmd_restart, self.few_requests) and self.mode.daemon != "shared":
                    continue
                if action in (self.flush_cache, self.after_flush) and self.mode.engine != "sglang":
                    continue  # SGLang's /flush_cache (vLLM's e2e has no such step)
                t0 = time.monotonic()
                notes = action()
                self.judge(name, notes, time.monotonic() - t0)
        finally:
            self.teardown()

    def steady(self) -> list[str]:
        self.router.start()
        self.register()
        if self.mode.daemon == "shared":
            self.start_daemon()
        self.start_engine()
        return self._requests(REQUESTS)

    def sigkill(self) -> list[str]:
        self.engine.sigkill()
        return self.after_engine_death("SIGKILL")

    def sigterm(self) -> list[str]:
        clean = self.engine.sigterm()
        notes = [] if clean else [f"{self.engine_name} did not exit within 60 s of SIGTERM"]
        return notes + self.after_engine_death("SIGTERM")

    def restart_with_requests(self) -> list[str]:
        self.start_engine()
        return self._requests(REQUESTS)

    def router_idle(self) -> list[str]:
        self.restart_router()
        return []

    def router_busy(self) -> list[str]:
        self.restart_router()
        return self._requests(FEW_REQUESTS)

    def flush_cache(self) -> list[str]:
        assert isinstance(self.engine, SGLangEngine)
        return [] if self.engine.flush_cache() else ["/flush_cache failed"]

    def after_flush(self) -> list[str]:
        return self._requests(FEW_REQUESTS)

    def kvshmd_restart(self) -> list[str]:
        self.daemon.kill()
        self.start_daemon()
        return []

    def few_requests(self) -> list[str]:
        return self._requests(FEW_REQUESTS)

    def _requests(self, n: int) -> list[str]:
        ok = self.engine.requests(n, self.rng)
        return [] if ok == n else [f"{n - ok} of {n} requests failed"]

    def teardown(self) -> None:
        if self.engine.proc is not None:
            self.engine.sigterm()
            self.after_engine_death("final SIGTERM")
        self.router.kill()
        if self.daemon.alive():
            self.daemon.stop(10.0)
        time.sleep(0.5)
        self.wire.close()
        reused = self.wire.record.reused()
        n = len(self.wire.record.seqs)
        self.checks.append(Check(
            "no seq reused on the wire", self.mode, not reused,
            f"{len(reused)} of {n} batches reuse a seq (first: {reused[0]})" if reused else f"{n} batches",
        ))


def _judged(state: State, hashes: frozenset[int]) -> Judged:
    extra, missing = extra_missing(state.hashes, hashes)
    return Judged(extra, missing, state.note)
