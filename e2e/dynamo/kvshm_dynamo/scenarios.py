"""The steps, run for each publisher / daemon mode (kvshm_e2e.table.MODES) with the same seeded requests.

Each mode is its own stack (discovery directory, ports, frontend, two workers, a shared kvshmd in shared mode).
A step acts (starts, kills, restarts) and then sends requests one at a time; every request's routing decision is
judged against what the chosen engine really had cached, and, for kvshm, against the control's decision for the
same request. Requests are PAUSE apart, so each decision sees the previous request's events with either publisher
(the judge is the router's state, not the event path's latency).
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvshm_e2e import truth
from kvshm_e2e.judges import KvshmdJudge
from kvshm_e2e.table import Mode

from kvshm_testkit import Kvshmd, cpu_seconds, extra_missing, wait_until

from .judges import BatchRecorder, Client, Decision, events_applied
from .model import FIRST_WORD
from .stack import BLOCK_SIZE, Frontend, Ports, Worker, stack_env

VOCAB_HIGH = 1024
STEADY = 48  # requests of the first step: ~24 per worker, 16 prefix + 48 own blocks each: evictions
PROBES = 8
PAUSE = 0.3
CONVERGE = 10.0  # kvshmd's /kv_recover must match the truth within this (docs/lifecycle.md)
PRIVATE_EXIT = 10.0


@dataclass(frozen=True)
class Setup:
    model: Path
    kvshmd_bin: Path
    out: Path
    base_port: int


@dataclass
class Row:
    step: str
    mode: Mode
    decisions: list[Decision]
    control: list[Decision] | None  # the control's decisions for the same requests (kvshm rows)
    applied: dict[str, int]  # the current frontend's applied-event counter after the step
    kvshmd: str  # /kv_recover against the truth, per worker ("n/a" without kvshmd)
    kvshmd_ok: bool
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def right(self) -> int:
        return sum(d.right for d in self.decisions)

    @property
    def failed(self) -> int:
        """Requests that got no answer: routed to a worker that had died before discovery dropped it (Dynamo's
        router and discovery decide those, whatever the publisher)."""
        return sum(d.cached < 0 for d in self.decisions)

    @property
    def wrong(self) -> int:
        """Served requests whose decision believed another overlap than the engine had."""
        return len(self.decisions) - self.right - self.failed

    @property
    def same(self) -> int | None:
        if self.control is None:
            return None
        return sum(a == b for a, b in zip(self.decisions, self.control, strict=False))

    @property
    def same_overlap(self) -> int | None:
        """Requests whose decision found as many blocks cached as the control's did, on whichever worker (two runs
        whose coins sent a prefix to different workers agree here)."""
        if self.control is None:
            return None
        return sum(a.overlap == b.overlap for a, b in zip(self.decisions, self.control, strict=False))

    @property
    def ties(self) -> int:
        """Requests whose two workers had the same overlap (the router's coin decided them)."""
        return sum(d.tie for d in self.decisions)

    def first_divergence(self) -> str:
        """The first request routed otherwise than the control's (1-based), and whether it was a tie in this run
        and in the control's ("-" when every decision was the control's, "" for the control itself)."""
        if self.control is None:
            return ""
        for i, (a, b) in enumerate(zip(self.decisions, self.control, strict=False)):
            if a != b:
                return f"#{i + 1}: {'tie' if a.tie else 'no tie'} here, {'tie' if b.tie else 'no tie'} in the control"
        return "-"

    @property
    def ok(self) -> bool:
        """A kvshm row is at least as right as the control: no more wrong beliefs, /kv_recover exact."""
        ctl_wrong = sum(d.cached >= 0 and not d.right for d in self.control) if self.control is not None else 0
        return self.wrong <= ctl_wrong and self.kvshmd_ok


class ModeRun:
    """One mode's stack, its steps and its rows."""

    def __init__(self, setup: Setup, mode: Mode, index: int, control: dict[str, list[Decision]] | None) -> None:
        self.setup = setup
        self.mode = mode
        self.control = control
        self.dir = setup.out / mode.name.replace(" ", "-")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        base = setup.base_port + 20 * index
        env = stack_env(os.environ, self.dir / "discovery")
        self.frontend = Frontend(base, env, self.dir)
        self.daemon = Kvshmd(setup.kvshmd_bin, self.dir, http=f"127.0.0.1:{base + 1}") \
            if mode.daemon == "shared" else None
        self.workers: list[Worker] = []
        self.kvshmd_http: dict[int, str] = {}
        for i in (1, 2):
            ports = Ports(http=0, pub=base + 2 + 2 * i, replay=base + 3 + 2 * i)
            wenv = dict(env)
            tmp = self.dir / f"tmp{i}"  # the worker's TMPDIR: where a private kvshmd's directory lives
            tmp.mkdir()
            wenv.update({truth.TRUTH_ENV: str(self.truth_path(i)), "TMPDIR": str(tmp), "KVSHM_WORKER_ID": str(i)})
            if self.daemon is not None:
                wenv["KVSHM_SOCKET"] = str(self.daemon.socket)
                self.kvshmd_http[i] = self.daemon.http
            elif mode.daemon == "private":
                self.kvshmd_http[i] = wenv["KVSHMD_HTTP"] = f"127.0.0.1:{base + 10 + i}"
            self.workers.append(Worker(i, setup.model, ports, mode.publisher, wenv, self.dir))
        self.wire = {w.index: BatchRecorder(f"tcp://127.0.0.1:{w.ports.pub}") for w in self.workers}
        self.rows: list[Row] = []
        self.checks: list[tuple[str, bool, str]] = []
        self.served = 0  # completions that succeeded (each one a prefill that stores new blocks: one engine batch)
        self.unknown = 0  # completions that failed while the frontend was killed (the engine may have run them)
        self.engine_cpu = 0.0  # engine-core CPU seconds over the steady step's requests, both workers
        self.kvshmd_cpu = 0.0

    def summary(self) -> dict[str, object]:
        """The mode's figures as JSON (results.json: what the tables are rendered from)."""
        return {
            "mode": self.mode.name, "served": self.served, "engine_cpu_s": self.engine_cpu,
            "kvshmd_cpu_s": self.kvshmd_cpu,
            "rows": [{"step": r.step, "decisions": [[d.worker, d.overlap, d.cached, list(d.overlaps)]
                                                    for d in r.decisions],
                      "applied": r.applied, "kvshmd": r.kvshmd, "kvshmd_ok": r.kvshmd_ok, "seconds": r.seconds,
                      "notes": r.notes} for r in self.rows],
            "batches": {str(i): vars(rec.count) for i, rec in self.wire.items()},
            "checks": [list(c) for c in self.checks],
        }

    def truth_path(self, i: int) -> Path:
        return self.dir / f"truth{i}.json"

    # --- the steps -------------------------------------------------------------------------------------------

    def run(self) -> None:
        steps: list[tuple[str, Callable[[], list[str]], int]] = [
            (f"steady serving, {STEADY} requests (evictions)", self.steady, STEADY),
            ("frontend restarted while busy", self.frontend_busy, PROBES),
            ("frontend restarted, idle", self.frontend_idle, PROBES),
            ("worker 2 SIGKILLed", self.sigkill, PROBES),
            ("worker 2 restarted", self.restart, 2 * PROBES),
            ("worker 2 SIGTERMed", self.sigterm, PROBES),
            ("worker 2 restarted after SIGTERM", self.restart, PROBES),
            ("shared kvshmd SIGKILLed and restarted", self.kvshmd_restart, PROBES),
        ]
        print(f"== {self.mode.name}", flush=True)
        try:
            for name, action, n in steps:
                if action == self.kvshmd_restart and self.daemon is None:
                    continue
                t0 = time.monotonic()
                notes = action()
                decisions = self.requests(name, n)
                self.judge(name, decisions, notes, time.monotonic() - t0)
        finally:
            self.teardown()

    def steady(self) -> list[str]:
        if self.daemon is not None:
            self.daemon.start(20.0)
        self.frontend.start()
        for w in self.workers:
            self.start_worker(w)
        return []

    def frontend_busy(self) -> list[str]:
        stop = threading.Event()
        client = self.client()
        rng = random.Random(7)

        def load() -> None:
            for _ in range(200):  # bounded; most fail while the frontend is down
                if stop.is_set():
                    return
                ok = client.complete(prompt(rng), timeout=10.0).cached >= 0
                self.served += ok
                self.unknown += not ok
                time.sleep(0.05)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        time.sleep(1.0)
        self.frontend.kill()
        self.frontend.start()
        stop.set()
        t.join(timeout=70.0)
        self.wait_served()
        return []

    def frontend_idle(self) -> list[str]:
        time.sleep(2.0)
        self.frontend.kill()
        self.frontend.start()
        self.wait_served()
        return []

    def sigkill(self) -> list[str]:
        self.workers[1].sigkill()
        return self.after_death("SIGKILL")

    def sigterm(self) -> list[str]:
        clean = self.workers[1].sigterm()
        return ([] if clean else ["worker 2 did not exit within 60 s of SIGTERM"]) + self.after_death("SIGTERM")

    def restart(self) -> list[str]:
        self.start_worker(self.workers[1])
        return []

    def kvshmd_restart(self) -> list[str]:
        assert self.daemon is not None
        self.daemon.kill()
        self.daemon.start(20.0)
        return []

    # --- plumbing --------------------------------------------------------------------------------------------

    def start_worker(self, w: Worker) -> None:
        self.truth_path(w.index).unlink(missing_ok=True)
        self.wire[w.index].incarnation(f"worker {w.index}.{w.incarnation + 1}")
        w.start(self.frontend)

    def wait_served(self) -> None:
        live = {w.dynamo_id for w in self.workers if w.proc is not None and w.dynamo_id is not None}
        wait_until("frontend serves the workers", lambda: self.frontend.serves(live), 120.0, 0.5)

    def client(self) -> Client:
        ids: dict[int, int] = {}
        for w in self.workers:
            ids.update(w.ids)
        return Client(self.frontend.url, self.frontend.log, ids)

    def requests(self, step: str, n: int) -> list[Decision]:
        rng = random.Random(step)  # the same requests in every mode
        client = self.client()
        cores = self.engine_cores()
        cpu0 = sum(cpu_seconds(p) for p in cores)
        kv0 = self.kvshmd_cpu_now()
        out = []
        for _ in range(n):
            p = prompt(rng)
            overlaps = tuple(self.wire[w.index].view.overlap(p) if w.proc is not None else -1 for w in self.workers)
            out.append(client.complete(p, overlaps=overlaps))
            self.served += out[-1].cached >= 0
            time.sleep(PAUSE)
        if step.startswith("steady"):
            self.engine_cpu = sum(cpu_seconds(p) for p in cores) - cpu0
            self.kvshmd_cpu = self.kvshmd_cpu_now() - kv0
        return out

    def engine_cores(self) -> list[int]:
        return engine_cores({w.proc.pid for w in self.workers if w.proc is not None})

    def kvshmd_cpu_now(self) -> float:
        return kvshmd_cpu(self.daemon, self.dir)

    def after_death(self, how: str) -> list[str]:
        """A private kvshmd after its engine is gone: it leaves nothing in the worker's TMPDIR."""
        if self.mode.daemon != "private":
            return []
        tmp = self.dir / "tmp2"
        left: list[str] = []

        def clean() -> bool:
            left[:] = sorted(p.name for p in tmp.glob("kvshm-*"))
            return not left

        try:
            wait_until("private dir removed", clean, PRIVATE_EXIT, 0.5)
        except Exception:
            pass
        self.checks.append((f"{how}: private dir removed", not left, ", ".join(left) or "nothing left"))
        return []

    def judge(self, step: str, decisions: list[Decision], notes: list[str], seconds: float) -> None:
        ctl = self.control.get(step) if self.control is not None else None
        cells, ok = self.judge_kvshmd()
        row = Row(step, self.mode, decisions, ctl, events_applied(self.frontend.url), cells, ok, seconds, notes)
        self.rows.append(row)
        if len(self.rows) == 1:  # the first frontend saw the whole stream: it applied every event the engines sent
            time.sleep(1.0)
            sent = sum(w.count.events for w in self.wire.values())
            merged = sum(w.count.merged for w in self.wire.values())
            applied = events_applied(self.frontend.url).get("ok", 0)
            self.checks.append(("steady serving: the router applied every event the engines published (adjacent "
                                "ones of a kind merged, as the relay does)", applied == merged,
                                f"applied {applied}, published {sent} ({merged} merged)"))
        print(f"  {step} ({seconds:.0f} s): right {row.right}/{len(decisions)}, failed {row.failed}"
              + (f", same as control {row.same}/{len(decisions)}" if row.same is not None else "")
              + (f", first divergence {row.first_divergence()}" if row.control is not None else "")
              + f", ties {row.ties}, applied { {k: v for k, v in row.applied.items() if v} }, kvshmd {cells} "
              + " ".join(d.cell() for d in decisions), flush=True)

    def judge_kvshmd(self) -> tuple[str, bool]:
        """/kv_recover of each worker against its engine's BlockPool, polled up to CONVERGE seconds."""
        if not self.kvshmd_http:
            return "n/a", True
        deadline = time.monotonic() + CONVERGE
        while True:
            cells, ok = [], True
            for w in self.workers:
                t = truth.read(self.truth_path(w.index)) if w.proc is not None else truth.EMPTY
                state = KvshmdJudge(self.kvshmd_http[w.index]).state(w.index)
                em = extra_missing(state.hashes, t.hashes)
                good = em.exact and state.note != "incomplete"
                if state.note == "down" and not t.hashes:
                    good = True  # a private kvshmd gone with its engine holds nothing: right
                ok &= good
                cells.append(f"w{w.index} {em}" + (f" ({state.note})" if state.note else ""))
            if ok or time.monotonic() >= deadline:
                return ", ".join(cells), ok
            time.sleep(0.5)

    def teardown(self) -> None:
        for w in self.workers:
            if w.proc is not None:
                w.sigterm()
        self.frontend.kill()
        if self.daemon is not None and self.daemon.alive():
            self.daemon.stop(10.0)
        time.sleep(0.5)
        for i, rec in self.wire.items():
            rec.close()
            reused = rec.record.reused()
            self.checks.append((f"worker {i}: no seq reused on the wire", not reused,
                                f"{len(reused)} reuse a seq (first: {reused[0]})" if reused
                                else f"{len(rec.record.seqs)} batches"))


def prompt(rng: random.Random) -> list[int]:
    """A 4-block prompt plus 5 tokens: 2 blocks from one of 8 shared prefixes, the rest random."""
    p = rng.randrange(8)
    prefix = [FIRST_WORD + (p * 97 + i) % (VOCAB_HIGH - FIRST_WORD) for i in range(2 * BLOCK_SIZE)]
    return prefix + [rng.randrange(FIRST_WORD, VOCAB_HIGH) for _ in range(2 * BLOCK_SIZE + 5)]


def engine_cores(groups: set[int]) -> list[int]:
    """The pids of the vLLM engine-core processes (``VLLM::EngineCore``, its name cut to 15 characters) in the
    process groups ``groups`` (the workers')."""
    return [pid for pid, pgid, name in _procs() if pgid in groups and "EngineCor" in name]


def model_workers(groups: set[int]) -> list[int]:
    """The pids of vLLM's model-executor processes (``VLLM::Worker...``: the forward passes, started by the engine
    core) in the process groups ``groups``."""
    return [pid for pid, pgid, name in _procs() if pgid in groups and name.startswith("VLLM::Wor")]


def worker_pids(groups: set[int]) -> list[int]:
    """The processes in ``groups`` that are neither vLLM's (engine core, model executor) nor a kvshmd: Dynamo's
    worker (``python -m dynamo.vllm``: vLLM's front end, Dynamo's relay and request plane) and its helpers."""
    return [pid for pid, pgid, name in _procs() if pgid in groups and "EngineCor" not in name
            and not name.startswith("VLLM::Wor") and not name.startswith("kvshmd")]


def worker_cpu(groups: set[int]) -> float:
    """The CPU seconds of :func:`worker_pids`."""
    return sum(cpu_seconds(pid) for pid in worker_pids(groups))


def kvshmd_pids(daemon: Kvshmd | None, under: Path) -> list[int]:
    """The shared ``daemon`` (when it runs), else every private kvshmd whose command line names a path under
    ``under`` (a mode's directory: its workers' TMPDIR)."""
    if daemon is not None and daemon.alive():
        return [daemon.pid]
    return [pid for pid, _, name in _procs() if name.startswith("kvshmd") and str(under) in _cmdline(pid)]


def kvshmd_cpu(daemon: Kvshmd | None, under: Path) -> float:
    """The CPU seconds of :func:`kvshmd_pids`."""
    return sum(cpu_seconds(pid) for pid in kvshmd_pids(daemon, under))


def _procs() -> list[tuple[int, int, str]]:
    """(pid, pgid, comm) of every process."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            head, rest = (d / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        out.append((int(d.name), int(rest.split()[2]), head.split("(", 1)[1]))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
