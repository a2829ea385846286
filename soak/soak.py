"""kvshm soak: the reliability campaign of issue 10 as a bounded, seeded, repeatable suite.

Run by ``make soak`` (``SOAK_TIME``, default 30m) and ``make soak-short`` (<= 3 min) with the Python of a venv
holding the installed wheel. Everything runs on this machine: kvshmd on a Unix socket in a private temp dir and
HTTP on 127.0.0.1 (port chosen by the kernel), rings in a temp dir, producers are real ``kvshm.LocalIndexer``s
in child processes (``producer.py``). Every process it starts is stopped by its pid; the tmpfs it may mount is
unmounted.

The judge (``judge``): after every fault, a consumer that recovers through ``GET /workers/{w}/kv_recover`` (or
``/kv_recover?worker_id=``), cold (``start=0``) and warm (from the state it rebuilt last time), must end with the
engine's true tree (``model.Truth``: the seeded stream replayed through a model of Dynamo's tree rules) at the
answer's ``last_event_id``, and hold every event the producer acknowledged; or the answer must say
``Kvshm-State: incomplete``. A complete answer with another state is a wrong answer; an answer still behind or
still ``Error`` at the deadline is a wrong answer (silent loss) or a hang.

Figures (printed, and written between the markers of RELIABILITY.md with ``--report``): faults injected, bad
inputs tried, wrong answers, hangs, crashes, leaks, known failures (each naming its defect), worst publish latency.
Exit status 1 when any wrong answer, hang, crash or leak was seen outside the known failures.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import http.client
import json
import os
import queue
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmq  # noqa: E402  (pyzmq: the ZMQ scenario's peers; the soak venv installs it with msgspec)
from model import AnswerError, StreamGen, Tree, Truth, consume  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FRAME = struct.Struct("<IBBH")
K_ATTACH, K_DETACH, K_EVENTS, K_DUMP, K_STATS, K_MATCH, K_HEALTH, K_FORGET = range(1, 9)
BLOCK = 4
VERBOSE = os.environ.get("SOAK_VERBOSE") == "1"
JUDGE_DEADLINE = 20.0  # seconds a consumer may take to converge after a fault before it counts as a hang

# Scenarios whose failures are a defect already filed and not yet fixed on the merged code: their failures are
# counted apart (known) and do not fail the run; SOAK_STRICT=1 counts them as failures. Each names its defect.
KNOWN: dict[str, str] = {
    "ring_truncate:publish": "issue 10 #5, producer side, file rings only (LocalIndexer(ring_dir=...) or "
    "KVSHM_RING_DIR): a publish into a truncated ring file kills the engine process with SIGBUS (exit -7) when it "
    "comes before the supervisor's next size check (1 s cadence). The default ring, a sealed memfd, cannot be "
    "truncated; "
    "the daemon side is fixed (SetPanicOnFault, idle size check)",
}
if os.environ.get("SOAK_KNOWN") is not None:  # e.g. SOAK_KNOWN= (empty) once the lead's fixes are merged
    KNOWN = {k: v for k, v in KNOWN.items() if k in os.environ["SOAK_KNOWN"].split(",")}


# Scenarios after which kvshm promises to lose nothing: a loss it reports there is a broken promise ("losses").
# (A SIGKILLed daemon with --checkpoint-interval: its successor restores the checkpoint and replays the ring.)
NO_LOSS = {"daemon_kill", "producer_kill", "producer_stop", "many_workers", "socket_hostile", "conn_cycles", "zmq",
           "http_hostile"}


def _loss_log(ctx: Ctx) -> str:
    """The daemon log lines that explain a loss (checkpoint restores, unknown history, stale checkpoints)."""
    d = ctx.daemon
    if d is None:
        return ""
    keep = [ln for ln in d.log_text().splitlines()
            if any(k in ln for k in ("checkpoint", "unknown", "lost", "loss", "stale", "resum"))]
    return " | ".join(ln[:300] for ln in keep[-4:])


# ---------------------------------------------------------------------------------------------------- figures
@dataclass
class Figures:
    faults: Counter[str] = field(default_factory=Counter)
    bad_inputs: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # wrong_answers, hangs, crashes, leaks
    known: Counter[str] = field(default_factory=Counter)
    judged: int = 0
    reported: int = 0  # answers that missed state and said so (Kvshm-State: incomplete)
    error_answers: int = 0  # Error variants seen while a consumer waited (daemon away, restarting)
    worst_pub_ns: int = 0
    worst_pub_by: dict[str, int] = field(default_factory=dict)  # scenario -> its worst publish latency
    reported_by: Counter[str] = field(default_factory=Counter)  # scenario -> answers reported incomplete
    details: list[str] = field(default_factory=list)
    scenario_runs: Counter[str] = field(default_factory=Counter)
    zmq: Counter[str] = field(default_factory=Counter)  # the ZMQ scenario's batches, gaps, drops, replays


class Ctx:
    def __init__(self, seed: int, kvshmd: str, work: str, strict: bool, short: bool) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.kvshmd = kvshmd
        self.work = work
        self.strict = strict
        self.short = short
        self.fig = Figures()
        self.scenario = ""
        self.next_worker = 100
        self.truths: dict[int, Truth] = {}
        self.lives: dict[int, int] = {}
        self.warm: dict[int, Tree] = {}
        self.acked: dict[int, int | None] = {}
        self.daemon: Daemon | None = None
        self.procs: list[subprocess.Popen[bytes]] = []  # every child ever started, for the final by-pid check
        self.tainted: set[int] = set()  # workers with a reported loss not yet re-based by a Cleared
        self.dead_rings: set[str] = set()  # ring files of producers killed (or crashed): nobody removes them

    def fail(self, kind: str, detail: str) -> None:
        """Count a failure (wrong_answers, hangs, crashes, leaks), known when the scenario's defect is filed."""
        line = f"[{self.scenario}] {kind}: {detail}"
        if self.scenario in KNOWN and not self.strict:
            self.fig.known[kind] += 1
            line += f" (known: {KNOWN[self.scenario]})"
        else:
            self.fig.failures[kind] += 1
        self.fig.details.append(line)
        print("  FAIL " + line, flush=True)

    def fault(self, what: str) -> None:
        self.fig.faults[what] += 1

    def bad(self, what: str, n: int = 1) -> None:
        self.fig.bad_inputs[what] += n

    def new_worker(self) -> int:
        self.next_worker += 1
        return self.next_worker


# ---------------------------------------------------------------------------------------------------- processes
def stop_pid(p: subprocess.Popen[Any], *, grace: float = 10.0) -> int | None:
    """SIGTERM the child by its pid, then SIGKILL after ``grace``; returns its exit status (None: SIGKILL needed)."""
    if p.poll() is not None:
        return p.returncode
    try:
        os.kill(p.pid, signal.SIGCONT)
        os.kill(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        return p.wait(grace)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        return None


class Daemon:
    """One kvshmd life (restarts make new objects sharing the socket and state dir)."""

    def __init__(self, ctx: Ctx, sock: str, state_dir: str, ckpt: str, extra: list[str] | None = None) -> None:
        self.ctx = ctx
        self.sock = sock
        self.state_dir = state_dir
        self.log_path = os.path.join(ctx.work, f"kvshmd-{int(time.time() * 1e6)}.log")
        args = [ctx.kvshmd, "serve", "--socket", sock, "--http", "127.0.0.1:0", "--log-format", "json",
                "--frame-timeout", "2s", "--idle-timeout", "20s", "--write-timeout", "5s",
                "--pid-check-interval", "200ms"]
        if state_dir:
            args += ["--state-dir", state_dir]
            if ckpt:
                args += ["--checkpoint-interval", ckpt]
        args += extra or []
        self.log = open(self.log_path, "wb")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        ctx.procs.append(self.p)
        self.pid = self.p.pid
        self.http = ""
        self.expected_exit = False
        t_end = time.monotonic() + 15
        while time.monotonic() < t_end and not self.http:
            if self.p.poll() is not None:
                raise RuntimeError(f"kvshmd exited {self.p.returncode} at start: {self.log_text()[-2000:]}")
            for line in self.log_text().splitlines():
                if '"kvshmd serving"' in line:
                    self.http = json.loads(line).get("http", "")
            time.sleep(0.02)
        if not self.http:
            raise RuntimeError(f"kvshmd did not come up: {self.log_text()[-2000:]}")
        self.base_fds: int | None = None
        self.base_rss: int | None = None
        self.seen: dict[str, int] = {}

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.expected_exit = True
            self.p.wait()

    def stop(self) -> None:
        self.expected_exit = True
        rc = stop_pid(self.p)
        if rc is None:
            self.ctx.fail("hangs", f"kvshmd {self.pid} ignored SIGTERM for 10 s")
        elif rc != 0:
            self.ctx.fail("crashes", f"kvshmd {self.pid} exited {rc} at SIGTERM: {self.log_text()[-1500:]}")
        self.log.close()

    def check(self) -> bool:
        """False when the daemon is gone; a death the soak did not cause counts one crash (with its log tail), and
        a panic or fatal error in the log of a live daemon (contained, but a bug) counts one crash each."""
        text = self.log_text()
        if not self.alive():
            if not self.expected_exit:
                self.expected_exit = True
                i = max(text.find("fatal error"), text.find("panic:"), text.find("unexpected signal"))
                why = text[i:i + 600] if i >= 0 else text[-600:]
                self.ctx.fail("crashes", f"kvshmd {self.pid} died by itself (status {self.p.returncode}): {why}")
            return False
        for marker in ("panic:", "fatal error:", "recovered panic", "panic recovered"):
            n = text.count(marker)
            seen = self.seen.get(marker, 0)
            if n > seen:
                self.seen[marker] = n
                i = text.find(marker)
                self.ctx.fail("crashes", f"kvshmd {self.pid} log has {marker!r}: {text[max(0, i - 100):i + 700]}")
        return True

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


class Producer:
    """A producer process (``producer.py``) with one LocalIndexer per worker."""

    def __init__(self, ctx: Ctx, workers: list[int], *, ring_bytes: int = 1 << 20, memfd: bool = False,
                 zmq_dir: str | None = None, buffer_steps: int = 10_000) -> None:
        self.ctx = ctx
        self.workers = workers
        assert ctx.daemon is not None
        pairs = ",".join(f"{w}:{ctx.lives.setdefault(w, 0)}" for w in workers)
        for w in workers:
            ctx.tainted.discard(w)  # a new producer: a new epoch, the stream starts empty
            ctx.truths[w] = Truth(StreamGen(ctx.seed, w, ctx.lives[w], BLOCK))
            ctx.warm[w] = Tree()
            ctx.acked[w] = None
        self.errlog = open(os.path.join(ctx.work, f"producer-{workers[0]}-{ctx.lives[workers[0]]}.log"), "wb")
        # File rings in the work dir (the leak check counts them), or LocalIndexer's default: a sealed memfd.
        env = dict(os.environ, KVSHM_RING_DIR=os.path.join(ctx.work, "rings"))
        if memfd:
            del env["KVSHM_RING_DIR"]
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "producer.py"), "--socket", ctx.daemon.sock, "--seed", str(ctx.seed),
             "--workers", pairs, "--block-size", str(BLOCK), "--ring-bytes", str(ring_bytes),
             *(["--zmq-dir", zmq_dir, "--buffer-steps", str(buffer_steps)] if zmq_dir else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog, env=env)
        ctx.procs.append(self.p)
        self.pid = self.p.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.dead = False
        self.rings: dict[int, str] = {}
        ready = self._get(30)
        if ready is None or not ready.get("ready"):
            raise RuntimeError(f"producer {self.pid} did not start: {self.stderr()[-1500:]}")
        self.rings = {int(w): r for w, r in ready["rings"].items()}
        self.outstanding = 0

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line.decode())
        self.lines.put(None)

    def stderr(self) -> str:
        with open(self.errlog.name, "rb") as f:
            return f.read().decode(errors="replace")

    def _get(self, timeout: float) -> dict[str, Any] | None:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.ctx.fail("hangs", f"producer {self.pid} gave no reply in {timeout} s")
            return None
        if line is None:
            self.check()
            return None
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(cmd) + "\n").encode())
        self.p.stdin.flush()
        self.outstanding += 1

    def call(self, cmd: dict[str, Any], timeout: float = 60) -> dict[str, Any] | None:
        """Send a command and wait for its reply (replies of commands sent without waiting are read first)."""
        if self.dead:
            return None
        try:
            self.send(cmd)
        except (BrokenPipeError, OSError):
            self.check()
            return None
        r = None
        while self.outstanding:
            r = self._get(timeout)
            self.outstanding -= 1
            if r is None:
                return None
            self._note(r)
        return r

    def _note(self, r: dict[str, Any]) -> None:
        lat = r.get("max_lat_ns")
        if lat is not None and not getattr(self, "stopped_since", False):
            f = self.ctx.fig
            f.worst_pub_ns = max(f.worst_pub_ns, int(lat))
            sc = self.ctx.scenario.split(":")[0]
            f.worst_pub_by[sc] = max(f.worst_pub_by.get(sc, 0), int(lat))

    def pub(self, w: int, n: int, pace_us: int = 0) -> dict[str, Any] | None:
        r = self.call({"op": "pub", "worker": w, "n": n, "pace_us": pace_us})
        if r is not None:
            self.ctx.truths[w].advance(n)
            self.ctx.acked[w] = r["last_seq"]
        return r

    def batch(self, w: int, n: int, pace_us: int = 0) -> dict[str, Any] | None:
        """The next ``n`` events as vLLM-shaped batches (``apply_batch``, published on ZMQ); the reply lists them."""
        r = self.call({"op": "batch", "worker": w, "n": n, "pace_us": pace_us}, timeout=120)
        if r is not None:
            self.ctx.truths[w].advance(n)
            self.ctx.acked[w] = r["last_seq"]
        return r

    def clear(self, w: int) -> dict[str, Any] | None:
        r = self.call({"op": "clear", "worker": w})
        if r is not None:
            self.ctx.truths[w].advance(1, kind="cleared")
            self.ctx.acked[w] = r["last_seq"]
        return r

    def check(self) -> bool:
        """False when the process died; counted a crash unless the soak killed it."""
        if self.p.poll() is None:
            return True
        if not self.dead:
            self.dead = True
            self.ctx.dead_rings.update(os.path.basename(r) for r in self.rings.values())
            self.ctx.fail("crashes", f"producer {self.pid} (workers {self.workers}) died with {self.p.returncode}: "
                          f"{self.stderr()[-1500:]}")
        return False

    def kill(self) -> None:
        """SIGKILL by pid (a fault): the streams keep the events the process published before."""
        self.dead = True
        self.ctx.dead_rings.update(os.path.basename(r) for r in self.rings.values())
        os.kill(self.pid, signal.SIGKILL)
        self.p.wait()
        for w in self.workers:
            self.ctx.acked[w] = None  # unknown: the judge takes the answer's last_event_id

    def quit(self) -> None:
        if self.dead:
            stop_pid(self.p, grace=2)
            return
        r = self.call({"op": "quit"}, timeout=30)
        self.dead = True
        if r is None or not r.get("bye"):
            if self.p.poll() is None:
                self.ctx.fail("hangs", f"producer {self.pid} did not quit")
        rc = stop_pid(self.p, grace=10)
        if rc not in (0, None) and rc != -signal.SIGTERM:
            self.ctx.fail("crashes", f"producer {self.pid} exited {rc} at quit: {self.stderr()[-1500:]}")
        self.errlog.close()


# ---------------------------------------------------------------------------------------------------- clients
def rpc(sock: str, kind: int, body: bytes, timeout: float = 10.0) -> tuple[int, int, int, bytes]:
    """One raw request on a fresh connection; returns (version, kind, status, body) of the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(FRAME.pack(len(body) + 4, 1, kind, 0) + body)
        return read_frame(s)


def read_frame(s: socket.socket) -> tuple[int, int, int, bytes]:
    hdr = recv_exact(s, 8)
    length, ver, kind, status = FRAME.unpack(hdr)
    if length < 4 or length > (1 << 30):
        raise ValueError(f"reply length {length}")
    return ver, kind, status, recv_exact(s, length - 4)


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += b
    return bytes(buf)


def healthy(ctx: Ctx, what: str, timeout: float = 10.0) -> bool:
    """The daemon answers HEALTH within ``timeout`` (else a hang, or a crash when it is gone)."""
    d = ctx.daemon
    assert d is not None
    t0 = time.monotonic()
    try:
        v, k, st, _ = rpc(d.sock, K_HEALTH, b"{}", timeout)
        if (v, k, st) != (1, K_HEALTH, 0):
            ctx.fail("wrong_answers", f"HEALTH after {what} replied version {v} kind {k} status {st}")
        return True
    except (OSError, ValueError, ConnectionError) as e:
        if d.check():
            ctx.fail("hangs", f"HEALTH after {what} failed after {time.monotonic() - t0:.1f} s: {e!r}")
        return False


def http_get(addr: str, path: str, timeout: float = 15.0) -> tuple[int, dict[str, str], bytes]:
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------------- the judge
def judge(ctx: Ctx, w: int, what: str, *, deadline: float = JUDGE_DEADLINE) -> None:
    """A cold and a warm consumer of worker ``w`` recover after ``what``; see the module doc for the verdicts."""
    if VERBOSE:
        print(f"    judge worker {w} after {what} (acked {ctx.acked.get(w)})", flush=True)
    for cold in (True, False):
        _judge_one(ctx, w, what, cold, deadline)


def _judge_one(ctx: Ctx, w: int, what: str, cold: bool, deadline: float) -> None:
    truth = ctx.truths[w]
    acked = ctx.acked.get(w)
    if ctx.scenario in KNOWN and not ctx.strict:
        deadline = min(deadline, 8.0)  # a filed defect: no need to wait the full deadline for it
    t_end = time.monotonic() + deadline
    problem = ""
    who = f"{'cold' if cold else 'warm'} consumer of worker {w} after {what}"
    while True:
        d = ctx.daemon
        assert d is not None
        state = Tree() if cold else ctx.warm.get(w, Tree())
        start = 0 if state.last is None else state.last + 1
        path = (f"/workers/{w}/kv_recover?start={start}" if ctx.rng.random() < 0.5
                else f"/kv_recover?start={start}&worker_id={w}")
        try:
            status, hdrs, body = http_get(d.http, path)
        except (OSError, http.client.HTTPException) as e:
            status, hdrs, body = 0, {}, repr(e).encode()
        if status != 200:
            problem = f"GET {path}: HTTP {status} {body[:300]!r}"
        else:
            try:
                variant, new = consume(state, body, w)
            except AnswerError as e:
                ctx.fig.judged += 1
                ctx.fail("wrong_answers", f"{who}: {e}")
                return
            incomplete = hdrs.get("kvshm-state") == "incomplete"
            if variant == "Error":
                ctx.fig.error_answers += 1
                problem = f"Error answer {body[:300]!r}"
            elif variant == "InvalidRange":
                ctx.fig.judged += 1
                ctx.fail("wrong_answers", f"{who}: InvalidRange for start={start}: {body[:300]!r}")
                return
            elif variant == "TooNew":
                if state.last is not None and (acked is None or state.last >= acked):
                    new = state  # nothing newer to learn: judge the state it has
                    variant = "Events"
                else:
                    problem = f"TooNew for start={start} (acked {acked}): {body[:300]!r}"
            if variant in ("Events", "TreeDump"):
                last = new.last
                if incomplete:
                    ctx.fig.judged += 1
                    ctx.fig.reported += 1
                    ctx.fig.reported_by[ctx.scenario] += 1
                    if ctx.scenario.split(":")[0] not in NO_LOSS:
                        ctx.tainted.add(w)  # a loss this scenario may cause: the stream stays so until a Cleared
                    elif cold and w not in ctx.tainted:
                        ctx.fail("losses", f"{who}: {variant} reported incomplete (Kvshm-Lost-Events: "
                                           f"{hdrs.get('kvshm-lost-events')}); daemon log: {_loss_log(ctx)}")
                    ctx.warm[w] = Tree()  # a consumer told its state is incomplete starts over
                    return
                if acked is not None and (last is None or last < acked):
                    problem = f"{variant} ends at id {last}, the producer published up to {acked}"
                else:
                    ctx.fig.judged += 1
                    diff = truth.at(last).diff(new)
                    if last is not None and not truth.seq_exists(last):
                        diff = diff or f"last_event_id {last} is no id the engine used"
                    if not diff:
                        ctx.warm[w] = new
                        return
                    ctx.fail("wrong_answers", f"{who}: complete {variant} (start={start}, last_event_id {last}) "
                                              f"differs from the engine: {diff}")
                    ctx.warm[w] = Tree()
                    return
        if time.monotonic() > t_end:
            ctx.fig.judged += 1
            kind = "wrong_answers" if "published up to" in problem else "hangs"
            ctx.fail(kind, f"{who}: not converged in {deadline:.0f} s: {problem}")
            ctx.warm[w] = Tree()
            return
        if not d.check():
            return
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------- helpers
@contextmanager
def producer(ctx: Ctx, n_workers: int = 1, **kw: Any) -> Iterator[Producer]:
    """A scenario's producer of fresh workers: quit (or reaped) and its workers forgotten afterwards."""
    ws = [ctx.new_worker() for _ in range(n_workers)]
    p = Producer(ctx, ws, **kw)
    try:
        yield p
    finally:
        p.quit()
        forget(ctx, p.workers)


def forget(ctx: Ctx, workers: list[int]) -> None:
    d = ctx.daemon
    if d is None or not d.alive():
        return
    for w in workers:
        for _ in range(50):
            try:
                _, _, st, body = rpc(d.sock, K_FORGET, json.dumps({"worker_id": w}).encode())
            except (OSError, ConnectionError, ValueError):
                break
            if st == 0 or b"conflict" not in body:
                break
            time.sleep(0.1)  # the DETACH of a quitting producer is still being processed
        for m in (ctx.truths, ctx.warm, ctx.acked):
            m.pop(w, None)


def publish_some(ctx: Ctx, p: Producer, n: int, pace_us: int = 0) -> None:
    for w in p.workers:
        p.pub(w, n, pace_us)


# ---------------------------------------------------------------------------------------------------- scenarios
def sc_socket_hostile(ctx: Ctx) -> None:
    """Garbage, oversize, truncated, unknown and non-strict frames; slowloris and half-open clients; attach to
    hostile ring paths. Each must get an error reply or a closed connection within bounds; others unaffected."""
    d = ctx.daemon
    assert d is not None
    rng = ctx.rng
    fifo = os.path.join(ctx.work, "fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo, 0o600)
    link = os.path.join(ctx.work, "zero-link")
    if not os.path.lexists(link):
        os.symlink("/dev/zero", link)
    small = os.path.join(ctx.work, "small.ring")
    with open(small, "wb") as f:
        f.write(b"KVSHMRG\0" + os.urandom(200))
    os.chmod(small, 0o600)

    def frame(kind: int, body: bytes, ver: int = 1, status: int = 0, length: int | None = None) -> bytes:
        return FRAME.pack(len(body) + 4 if length is None else length, ver, kind, status) + body

    bodies = [b"", b"null", b"[]", b"{", b"\xff\xfe", b'{"START":1}', b'{"start":1,"start":2}', b'{"worker_id":-1}',
              b'{"worker_id":18446744073709551616}', b'{"start":"1"}', b'{"start":1e30}', b'{"worker_id":1} x',
              b'{"tokens":[-1]}', b'{"tokens":' + b"[1," * 1000 + b"1" + b"]" * 1000 + b"}", b'{"x":' * 5000,
              json.dumps({"start": 5, "end": 1, "worker_id": 1}).encode(), b'{"worker_id":999999}',
              b'{"dp_rank":4294967296}']
    attach_paths = ["/dev/zero", "/etc/passwd", fifo, link, small, ctx.work, "/nonexistent/ring", "", "\x00",
                    "relative.ring", "/proc/self/mem"]
    cases: list[tuple[str, bytes]] = []
    for _ in range(40 if ctx.short else 120):
        r = rng.random()
        if r < 0.15:
            cases.append(("random bytes", os.urandom(rng.randint(1, 300))))
        elif r < 0.25:
            cases.append(("oversize length", frame(K_HEALTH, b"{}", length=rng.choice([0xFFFFFFFF, 5 << 20, 1 << 30]))))
        elif r < 0.3:
            cases.append(("short length", frame(K_HEALTH, b"", length=rng.randint(0, 3))))
        elif r < 0.37:
            cases.append(("bad version", frame(K_HEALTH, b"{}", ver=rng.choice([0, 2, 255]))))
        elif r < 0.44:
            cases.append(("unknown kind", frame(rng.choice([0, 9, 77, 255]), b"{}")))
        elif r < 0.48:
            cases.append(("nonzero status", frame(K_HEALTH, b"{}", status=rng.randint(1, 65535))))
        elif r < 0.75:
            cases.append(("bad body", frame(rng.randint(1, 8), rng.choice(bodies))))
        elif r < 0.88:
            body = json.dumps({"ring_path": rng.choice(attach_paths), "worker_id": rng.randint(0, 1 << 64 - 1),
                               "kv_block_size": rng.choice([0, 1, 16, 1 << 31]), "max_buffer_size": 10}).encode()
            cases.append(("hostile attach", frame(K_ATTACH, body)))
        else:
            good = frame(K_EVENTS, b'{"worker_id":1,"start":0}')
            cases.append(("truncated frame", good[: rng.randint(1, len(good) - 1)]))
    for what, data in cases:
        ctx.bad("socket: " + what)
        t0 = time.monotonic()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(8)
                s.connect(d.sock)
                s.sendall(data)
                if what == "truncated frame":
                    s.shutdown(socket.SHUT_WR)  # half-open: the daemon must not wait for the rest forever
                try:
                    ver, _kind, status, body = read_frame(s)
                    if ver != 1:
                        ctx.fail("wrong_answers", f"socket {what}: reply version {ver}")
                    elif status == 0 and (what != "bad body" or _must_refuse(data)):
                        ctx.fail("wrong_answers", f"socket {what} {data[:60]!r}: OK reply {body[:200]!r}")
                except (ConnectionError, ValueError):
                    pass  # closed: an accepted outcome
        except TimeoutError:
            ctx.fail("hangs", f"socket {what} {data[:60]!r}: no reply or close in 8 s")
        except OSError as e:
            if e.errno not in (errno.ECONNRESET, errno.EPIPE):
                ctx.fail("hangs", f"socket {what}: {e!r}")
        if time.monotonic() - t0 > 6:
            ctx.fail("hangs", f"socket {what}: took {time.monotonic() - t0:.1f} s")
    # Slowloris and silent clients alongside good queries: the good ones must not wait for them.
    slow: list[socket.socket] = []
    for i in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        if i % 2:
            s.sendall(FRAME.pack(1 << 20, 1, K_EVENTS, 0)[: 1 + i % 7])
        slow.append(s)
    ctx.bad("socket: slowloris/silent", len(slow))
    t0 = time.monotonic()
    for _ in range(20):
        healthy(ctx, "slowloris clients", timeout=3)
        for i, s in enumerate(slow):
            if i % 3 == 0:
                try:
                    s.send(b"\0")
                except OSError:
                    pass
    if time.monotonic() - t0 > 10:
        ctx.fail("hangs", f"20 HEALTHs beside 20 slow clients took {time.monotonic() - t0:.1f} s")
    time.sleep(2.5)  # past --frame-timeout (2 s): every client with a started frame must have been let go
    for i, s in enumerate(slow):
        started = i % 2 == 1 or i % 3 == 0  # a partial header, or the NUL bytes sent above
        s.settimeout(1.5)
        try:
            while s.recv(1 << 16):
                pass  # an error reply, then the close
        except TimeoutError:
            if started:
                ctx.fail("hangs", f"a client with a started frame still open {2.5 + 1.5:.1f} s after it began "
                                  "(--frame-timeout 2s)")
        except OSError:
            pass
        s.close()
    healthy(ctx, "socket hostiles")
    ctx.fault("hostile socket clients")


def _must_refuse(frame: bytes) -> bool:
    """A body every strict decoder refuses (issue 10 #9): not an object, a key in another case, a duplicate key,
    a number out of range, trailing bytes, bad JSON. (Unknown keys are not in the list: the protocol may ignore
    them.)"""
    body = frame[8:]
    if not body:
        return False  # an empty body is {} (daemon/protocol.go)
    try:
        doc = json.loads(body, object_pairs_hook=lambda kv: (kv, dict(kv)))
    except ValueError:
        return True
    if not isinstance(doc, tuple):
        return True
    pairs, _ = doc
    keys = [k for k, _ in pairs]
    return len(keys) != len(set(keys)) or any(k != k.lower() for k in keys) or any(
        isinstance(v, int) and not 0 <= v < (1 << 64) for _, v in pairs)


def sc_hostile_detach(ctx: Ctx) -> None:
    """Another same-uid client sends DETACH for a live producer's worker (issue 10 #2): the producer goes on
    publishing; the consumer must get every event or be told of the loss."""
    d = ctx.daemon
    assert d is not None
    with producer(ctx, 1) as p:
        w = p.workers[0]
        p.pub(w, 100)
        try:
            _, _, st, body = rpc(d.sock, K_DETACH, json.dumps({"worker_id": w}).encode())
        except (OSError, ConnectionError, ValueError) as e:
            st, body = -1, repr(e).encode()
        ctx.bad("socket: DETACH of another client's live producer")
        ctx.fault(f"foreign DETACH of a live producer (reply status {st})")
        p.pub(w, 300)
        judge(ctx, w, f"a foreign DETACH (reply status {st}: {body[:120]!r})")


def sc_ckpt_corrupt(ctx: Ctx, base: Producer) -> None:
    """SIGKILL the daemon and replace its checkpoints by a symlink to /dev/zero, a FIFO, garbage or a truncated
    copy (issue 10 #7), then restart it: it must come up at once and answer right or say what it lost."""
    d = ctx.daemon
    assert d is not None
    rng = ctx.rng
    publish_some(ctx, base, 50)
    time.sleep(0.5)  # a checkpoint (200ms interval)
    d.signal(signal.SIGKILL)
    how = rng.choice(["symlink to /dev/zero", "FIFO", "garbage", "truncated", "emptied"])
    names = [n for n in os.listdir(d.state_dir) if n.endswith(".ckpt")]
    for n in names:
        path = os.path.join(d.state_dir, n)
        if how == "truncated":
            os.truncate(path, max(0, os.path.getsize(path) // 2))
            continue
        os.unlink(path)
        if how == "symlink to /dev/zero":
            os.symlink("/dev/zero", path)
        elif how == "FIFO":
            os.mkfifo(path, 0o600)
        else:
            with open(path, "wb") as f:
                f.write(os.urandom(rng.randint(1, 4096)) if how == "garbage" else b"")
            os.chmod(path, 0o600)
    ctx.fault(f"SIGKILL daemon, checkpoints replaced: {how} ({len(names)} files)")
    ctx.scenario = f"ckpt_corrupt:{how}"
    t0 = time.monotonic()
    before = sum(ctx.fig.failures.values()) + sum(ctx.fig.known.values())
    try:
        restart_daemon(ctx, d)
    except RuntimeError as e:
        ctx.fail("hangs", f"kvshmd did not come up over checkpoints ({how}): {e}")
        raise
    if time.monotonic() - t0 > 10:
        ctx.fail("hangs", f"kvshmd took {time.monotonic() - t0:.1f} s to come up over checkpoints ({how})")
    publish_some(ctx, base, 20)
    for w in base.workers:
        judge(ctx, w, f"checkpoints replaced ({how})")
    if sum(ctx.fig.failures.values()) + sum(ctx.fig.known.values()) > before:
        # A wedged daemon would fail every later scenario: SIGKILL it, remove what wedged it, start a new one.
        d = ctx.daemon
        assert d is not None
        d.signal(signal.SIGKILL)
        for n in os.listdir(d.state_dir):
            os.unlink(os.path.join(d.state_dir, n))
        restart_daemon(ctx, d)
        publish_some(ctx, base, 20)


def sc_conn_cycles(ctx: Ctx) -> None:
    """10,000 connect / HEALTH / close cycles (and abrupt closes): no fd leak, no refusal."""
    d = ctx.daemon
    assert d is not None
    fds0 = d.fds()
    n = 10000
    fails = 0
    for i in range(n):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(d.sock)
                if i % 10 == 9:
                    s.sendall(FRAME.pack(6, 1, K_HEALTH, 0))  # close mid-frame
                    continue
                s.sendall(FRAME.pack(6, 1, K_HEALTH, 0) + b"{}")
                if i % 10 != 8:  # close without reading the reply
                    read_frame(s)
        except (OSError, ConnectionError, ValueError) as e:
            fails += 1
            if fails <= 3:
                print(f"  connection cycle {i}: {e!r}")
    ctx.bad("socket: connection cycles", n)
    if fails > n // 1000:
        ctx.fail("wrong_answers", f"{fails} of {n} connection cycles failed")
    time.sleep(0.5)
    fds1 = d.fds()
    if fds1 > fds0 + 4:
        ctx.fail("leaks", f"kvshmd fds {fds0} -> {fds1} after {n} connection cycles")
    healthy(ctx, "connection cycles")
    ctx.fault("10000 connection cycles")


def sc_http_hostile(ctx: Ctx) -> None:
    """Bad query strings, bad methods and paths, huge headers, slow headers, half-open and too many HTTP
    connections: a 4xx/503 or a close, never a hang; the real route keeps answering."""
    d = ctx.daemon
    assert d is not None
    host, port = d.http.rsplit(":", 1)
    rng = ctx.rng
    w = next(iter(ctx.truths)) if ctx.truths else 1
    queries = ["start=-1", "start=abc", "start=1e30", "start=18446744073709551616", "start=1&start=2", "start=%00",
               "start=5&end=1", f"worker_id={w}&worker_id={w}", "worker_id=-3", "dp_rank=99999999999", "end=",
               "start=" + "9" * 5000, "start=1;end=2", "%zz", "worker_id=0x10"]
    paths = ["/kv_recover?" + q for q in queries] + [
        "/workers/x/kv_recover", "/workers/18446744073709551616/kv_recover", f"/workers/{w}/dp/4294967296/kv_recover",
        "/../../etc/passwd", "/kv_recover/../metrics", "//kv_recover", "/workers//kv_recover", "/" + "a" * 10000,
        f"/workers/{w}/dp/-1/kv_recover"]
    raws = [b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\x00",
            b"GET /kv_recover HTTP/1.1\r\nHost: x\r\nX: " + b"a" * (2 << 20) + b"\r\n\r\n",
            b"POST /kv_recover?start=0 HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nabc",
            b"GET /kv_recover?start=0 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 50]
    n = 30 if ctx.short else 100
    for _ in range(n):
        r = rng.random()
        try:
            if r < 0.6:
                method = rng.choice(["GET", "GET", "GET", "POST", "PUT", "DELETE", "OPTIONS", "TRACE"])
                path = rng.choice(paths)
                ctx.bad("http: " + ("bad query/path" if method == "GET" else "bad method"))
                c = http.client.HTTPConnection(host, int(port), timeout=8)
                c.request(method, path)
                resp = c.getresponse()
                resp.read()
                c.close()
                if resp.status == 200 and path.startswith("/kv_recover?") and method == "GET" and "start=" not in path:
                    pass
                if resp.status >= 500 and resp.status != 503:
                    ctx.fail("wrong_answers", f"HTTP {method} {path[:80]}: {resp.status}")
            else:
                data = rng.choice(raws)
                ctx.bad("http: raw bad request")
                with socket.create_connection((host, int(port)), timeout=8) as s:
                    try:
                        s.sendall(data)
                        s.shutdown(socket.SHUT_WR)
                        while s.recv(65536):
                            pass
                    except (ConnectionResetError, BrokenPipeError):
                        pass
        except TimeoutError:
            ctx.fail("hangs", "HTTP hostile request: no answer or close in 8 s")
        except (OSError, http.client.HTTPException):
            pass
    # Slow headers and too many connections beside real queries.
    held: list[socket.socket] = []
    for i in range(300):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.sendall(b"GET /kv_recover?start=0 HTTP/1.1\r\nHo")
            held.append(s)
        except OSError:
            break
    ctx.bad("http: held/slow connections", len(held))
    t0 = time.monotonic()
    ok = False
    while time.monotonic() - t0 < 15:
        try:
            st, _, _ = http_get(d.http, "/healthz", timeout=3)
            if st == 200:
                ok = True
                break
        except (OSError, http.client.HTTPException):
            pass
        held.pop().close() if held else None
    for s in held:
        s.close()
    if not ok:
        ctx.fail("hangs", "no /healthz answer beside 300 held HTTP connections within 15 s")
    healthy(ctx, "HTTP hostiles")
    ctx.fault("hostile HTTP clients")


def sc_ring_scribble(ctx: Ctx) -> None:
    """Scribble random data words and header words of an attached ring while its producer publishes."""
    rng = ctx.rng
    with producer(ctx, 1) as p:
        w = p.workers[0]
        p.pub(w, 200)
        judge(ctx, w, "publishing (before scribbling)")
        ring = p.rings[w]
        size = os.path.getsize(ring)
        fd = os.open(ring, os.O_RDWR)
        try:
            for _ in range(rng.randint(1, 4)):
                r = rng.random()
                if r < 0.5:
                    off = 4096 + rng.randrange(0, size - 4096 - 8) // 8 * 8
                    what = "ring data word"
                else:
                    off, what = rng.choice([(0x00, "magic"), (0x08, "version"), (0x10, "capacity"),
                                            (0x18, "max_record"), (0x30, "epoch"), (0x38, "worker_id"),
                                            (0x40, "kv_block_size"), (0x48, "state"), (0x80, "tail"), (0x100, "head"),
                                            (0x180, "dropped_events"), (0x190, "loss_first_seq"),
                                            (0x1A0, "loss_pending")])
                val = rng.choice([0, 1, 2, (1 << 64) - 1, rng.randrange(1 << 64), 1 << 40])
                os.pwrite(fd, struct.pack("<Q", val), off)
                ctx.fault("ring scribble: " + what)
                p.pub(w, rng.randint(1, 50))
        finally:
            os.close(fd)
        p.pub(w, 50)
        if not p.check() or not ctx.daemon or not ctx.daemon.check():
            return
        p.clear(w)  # the engine's next Cleared re-bases the stream
        p.pub(w, 100)
        judge(ctx, w, "ring scribbles and a Cleared")
        healthy(ctx, "ring scribbles")


def sc_ring_truncate(ctx: Ctx) -> None:
    """Truncate an attached ring file (to 0, one page, or half) while its producer publishes. Half the runs use
    LocalIndexer's default ring, a sealed memfd: the truncation must be refused (EPERM) and nothing else happen."""
    rng = ctx.rng
    memfd = rng.random() < 0.5
    with producer(ctx, 1, memfd=memfd) as p:
        w = p.workers[0]
        p.pub(w, 100)
        ring = p.rings[w]
        size = os.path.getsize(ring)
        new = rng.choice([0, 4096, size // 2])
        if memfd:
            try:
                os.truncate(ring, new)
            except PermissionError:
                ctx.fault("memfd ring truncation refused")
                p.pub(w, 50)
                judge(ctx, w, "refused truncation of a sealed memfd ring")
                healthy(ctx, "refused ring truncation")
                return
            ctx.fail("wrong answers", f"the memfd ring {ring} of worker {w} could be truncated (not sealed)")
            return
        os.truncate(ring, new)
        delay = rng.uniform(0, 2)
        ctx.fault(f"ring truncated to {new} bytes")
        time.sleep(delay)  # the producer's supervisor checks the file size every second (issue 10 #5 fix)
        ctx.scenario = "ring_truncate:publish"  # only the producer's death here is the known failure
        r = p.pub(w, 50)
        time.sleep(0.5)
        ok_p = p.check()
        ctx.scenario = "ring_truncate"
        if r is not None:
            st = p.call({"op": "stats", "worker": w})
            ps = st["stats"] if st else {}
            ctx.fault("ring truncated, producer alive")
            ctx.fig.details.append(
                f"[ring_truncate] worker {w}: truncated to {new} of {size} bytes, published 50 events {delay:.2f} s "
                f"later; producer: ring_truncated={ps.get('ring_truncated')}, "
                f"dropped_events={ps.get('dropped_events')}")
        ok_d = ctx.daemon is not None and ctx.daemon.check()
        if ok_d:
            healthy(ctx, "ring truncation")
        if ok_d and ok_p:
            ctx.scenario = "ring_truncate:judge"
            judge(ctx, w, "ring truncation", deadline=5)
            ctx.scenario = "ring_truncate"


def sc_daemon_kill(ctx: Ctx, base: Producer) -> None:
    """SIGKILL the daemon at a random instant while producers publish (sometimes just as a checkpoint file
    appears in the state dir), restart it on the same socket and state dir; producers reattach by themselves.
    One to three kills in a row, each judged."""
    for _ in range(ctx.rng.randint(1, 3)):
        _daemon_kill_once(ctx, base)


def _daemon_kill_once(ctx: Ctx, base: Producer) -> None:
    d = ctx.daemon
    assert d is not None
    rng = ctx.rng
    in_ckpt = rng.random() < 0.5
    for w in base.workers:
        base.send({"op": "pub", "worker": w, "n": 400, "pace_us": 500})
    if in_ckpt:
        before = _state_files(d.state_dir)
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end and _state_files(d.state_dir) == before:
            pass
        what = "SIGKILL daemon as a checkpoint file changed"
    else:
        time.sleep(rng.uniform(0, 0.4))
        what = "SIGKILL daemon at a random instant"
    d.check()
    d.signal(signal.SIGKILL)
    ctx.fault(what)
    time.sleep(rng.uniform(0, 0.3))
    restart_daemon(ctx, d)
    base.call({"op": "stats", "worker": base.workers[0]})  # collects the pub replies (the truth advances below)
    for w in base.workers:
        ctx.truths[w].advance(400)
        ctx.acked[w] = ctx.truths[w].last_seq
        base.pub(w, 20)
    for w in base.workers:
        judge(ctx, w, what)


def _state_files(path: str) -> dict[str, int] | None:
    """Name -> mtime of the files in a state dir (None when it changed while being listed)."""
    try:
        return {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)}
    except FileNotFoundError:
        return None


def restart_daemon(ctx: Ctx, old: Daemon) -> None:
    old.check()
    try:
        old.log.close()
    except OSError:
        pass
    ctx.daemon = Daemon(ctx, old.sock, old.state_dir, "200ms")
    healthy(ctx, "restart")


def sc_daemon_stop(ctx: Ctx) -> None:
    """SIGSTOP the daemon, publish into a 64 KiB ring until events drop, SIGCONT, publish nothing more: the very
    next answer must report the loss (issue 10 #1); a Cleared then re-bases the stream to a complete answer."""
    d = ctx.daemon
    assert d is not None
    with producer(ctx, 1, ring_bytes=64 << 10) as p:
        w = p.workers[0]
        p.pub(w, 50)
        judge(ctx, w, "publishing (before SIGSTOP)")
        os.kill(d.pid, signal.SIGSTOP)
        ctx.fault("SIGSTOP daemon")
        try:
            dropped = 0
            for _ in range(200):
                r = p.pub(w, 50)
                if r is None or r["dropped"] > 0:
                    dropped = r["dropped"] if r else 0
                    break
            p.pub(w, ctx.rng.randint(0, 60))
        finally:
            os.kill(d.pid, signal.SIGCONT)
        if not dropped:
            ctx.fig.details.append("[daemon_stop] the ring never dropped (no loss to report)")
        judge(ctx, w, f"SIGSTOP/SIGCONT with {dropped}+ drops")
        p.clear(w)
        p.pub(w, 30)
        judge(ctx, w, "a Cleared after the drops")


def sc_producer_kill(ctx: Ctx) -> None:
    """SIGKILL a producer mid-publish (the dead stream stays queryable and must match a prefix of its stream),
    then start its successor for the same worker (a new epoch: the worker's cache starts empty)."""
    rng = ctx.rng
    ws = [ctx.new_worker()]
    p = Producer(ctx, ws)
    w = ws[0]
    try:
        p.pub(w, 100)
        p.send({"op": "pub", "worker": w, "n": 5000, "pace_us": 0})
        time.sleep(rng.uniform(0, 0.5))
        p.kill()
        ctx.fault("SIGKILL producer mid-publish")
        judge(ctx, w, "producer SIGKILL")
        ctx.lives[w] += 1
        p = Producer(ctx, ws)
        ctx.fault("producer restart (new epoch)")
        p.pub(w, 100)
        judge(ctx, w, "producer restart")
    finally:
        p.quit()
        forget(ctx, ws)


def sc_producer_stop(ctx: Ctx) -> None:
    """SIGSTOP a producer mid-publish for a random while, SIGCONT it, publish on: nothing lost, nothing invented."""
    rng = ctx.rng
    with producer(ctx, 1) as p:
        w = p.workers[0]
        p.send({"op": "pub", "worker": w, "n": 1000, "pace_us": 200})
        time.sleep(rng.uniform(0, 0.2))
        os.kill(p.pid, signal.SIGSTOP)
        ctx.fault("SIGSTOP producer")
        time.sleep(rng.uniform(0.1, 1.5))
        # While it is stopped the daemon holds a prefix: that prefix must be right.
        ctx.acked[w] = None
        judge(ctx, w, "producer SIGSTOP (stopped)")
        os.kill(p.pid, signal.SIGCONT)
        p.stopped_since = True  # type: ignore[attr-defined]
        p.call({"op": "stats", "worker": w})
        p.stopped_since = False  # type: ignore[attr-defined]
        ctx.truths[w].advance(1000)
        ctx.acked[w] = ctx.truths[w].last_seq
        p.pub(w, 20)
        judge(ctx, w, "producer SIGCONT")


def sc_many_workers(ctx: Ctx) -> None:
    """64 workers on one daemon (8 processes x 8 LocalIndexers), publishing at once; every one judged."""
    procs: list[Producer] = []
    try:
        for _ in range(8):
            procs.append(Producer(ctx, [ctx.new_worker() for _ in range(8)], ring_bytes=256 << 10))
        n = 30 if ctx.short else 150
        for p in procs:
            for w in p.workers:
                p.send({"op": "pub", "worker": w, "n": n, "pace_us": 0})
        for p in procs:
            p.call({"op": "stats", "worker": p.workers[0]}, timeout=120)
            for w in p.workers:
                ctx.truths[w].advance(n)
                ctx.acked[w] = ctx.truths[w].last_seq
        ctx.fault("64 workers on one daemon")
        for p in procs:
            for w in p.workers:
                judge(ctx, w, "64 workers publishing")
    finally:
        for p in procs:
            p.quit()
            forget(ctx, p.workers)


def sc_tmpfs_state(ctx: Ctx) -> None:
    """A daemon whose --state-dir is a 64 KiB tmpfs: checkpoints fail (disk full) while running, then SIGKILL; the
    successor must not answer a silent wrong state. Needs root to mount; skipped (and said) otherwise."""
    if os.geteuid() != 0:
        ctx.fig.details.append("[tmpfs_state] skipped: not root, cannot mount a tmpfs")
        return
    mnt = tempfile.mkdtemp(prefix="tmpfs-", dir=ctx.work)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", mnt], capture_output=True)
    if r.returncode != 0:
        ctx.fig.details.append(f"[tmpfs_state] skipped: mount failed: {r.stderr.decode().strip()}")
        return
    main = ctx.daemon
    sock = os.path.join(tempfile.mkdtemp(prefix="sock-", dir=ctx.work), "k.sock")
    try:
        ctx.daemon = Daemon(ctx, sock, os.path.join(mnt, "state"), "200ms")
        with producer(ctx, 2) as p:
            for _ in range(6):
                publish_some(ctx, p, 250)
            ctx.fault("state dir on a full 64 KiB tmpfs")
            time.sleep(0.5)
            for w in p.workers:
                judge(ctx, w, "checkpoints on a full tmpfs")
            d = ctx.daemon
            d.signal(signal.SIGKILL)
            ctx.fault("SIGKILL daemon with a full state dir")
            restart_daemon(ctx, d)
            publish_some(ctx, p, 20)
            for w in p.workers:
                judge(ctx, w, "restart after checkpoints on a full tmpfs")
        ctx.daemon.stop()
    finally:
        ctx.daemon = main
        subprocess.run(["umount", mnt], check=False)


# ---------------------------------------------------------------------------------------------------- ZMQ (issue 12)
END_SEQ = b"\xff" * 8
ZMTP_SIG = b"\xff" + b"\x00" * 8 + b"\x7f"  # a ZMTP 3 greeting's first 10 bytes (what libzmq sends first)


def _digest(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def zmq_replay(zc: Any, ep: str, start: int, timeout: float) -> tuple[list[tuple[int, str]] | None, str]:
    """A healthy DEALER's replay from ``start``: [(seq, payload digest)] up to the end marker, or None and why."""
    d = zc.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    d.connect(ep)
    try:
        d.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[tuple[int, str]] = []
        while True:
            try:
                fr = d.recv_multipart()
            except zmq.Again:
                return None, f"no end marker within {timeout:.0f} s of the last frame ({len(out)} batches before)"
            if len(fr) != 4 or fr[0] != b"" or len(fr[2]) != 8:
                return None, f"malformed replay reply {[f[:16] for f in fr[:5]]!r}"
            if fr[2] == END_SEQ and fr[3] == b"":
                return out, ""
            out.append((int.from_bytes(fr[2], "big"), _digest(fr[3])))
    finally:
        d.close(0)


class SubJudge:
    """The healthy subscriber: reads every message into memory in its own thread."""

    def __init__(self, zc: Any, ep: str, *, rcvhwm: int = 0) -> None:
        self.s = zc.socket(zmq.SUB)
        if rcvhwm:
            self.s.setsockopt(zmq.RCVHWM, rcvhwm)
            self.s.setsockopt(zmq.RCVBUF, 4096)
        self.pause = threading.Event()  # set: the subscriber stops reading (a consumer busy elsewhere)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.setsockopt(zmq.RCVTIMEO, 100)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.connect(ep)
        self.got: list[tuple[int, str]] = []
        self.bad: list[str] = []
        self.max_gap = 0.0  # the longest wait between two messages (s)
        self.t_last = 0.0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.pause.is_set():
                time.sleep(0.05)
                continue
            try:
                fr = self.s.recv_multipart()
            except zmq.Again:
                continue
            if len(fr) != 3 or len(fr[1]) != 8:
                self.bad.append(f"message of {len(fr)} frames {[f[:16] for f in fr[:4]]!r}")
                continue
            now = time.monotonic()
            if self.got:
                self.max_gap = max(self.max_gap, now - self.t_last)
            self.t_last = now
            self.got.append((int.from_bytes(fr[1], "big"), _digest(fr[2])))
        self.s.close(0)


class ZmqHostiles:
    """Hostile ZMQ and raw peers of one stream's PUB and ROUTER endpoints, each kind in its own thread."""

    def __init__(self, ctx: Ctx, zc: Any, pub_ep: str, rep_ep: str) -> None:
        self.ctx, self.zc, self.pub_ep, self.rep_ep = ctx, zc, pub_ep, rep_ep
        self.paths = [pub_ep.removeprefix("ipc://"), rep_ep.removeprefix("ipc://")]
        self.rng = random.Random(ctx.rng.random())
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.replied_to_bad: list[str] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self.bad_replay, self.flood, self.sub_churn, self.stuck_sub, self.raw_garbage)]
        self.stallers: list[socket.socket] = []

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _guard(self, f: Callable[[], None]) -> None:
        try:
            f()
        except Exception as e:  # a broken hostile is the suite's bug: say so
            self.errors.append(f"{f.__name__}: {e!r} {traceback.format_exc()[-800:]}")

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def bad_replay(self) -> None:
        """DEALERs sending only requests the contract says are counted and ignored (no reply)."""
        rng = self.rng
        seq8 = (0).to_bytes(8, "big")
        kinds: list[tuple[str, Callable[[], list[bytes]]]] = [
            ("no delimiter", lambda: [seq8]),
            ("4 frames", lambda: [b"", seq8, b"x"]),
            ("delimiter only", lambda: [b""]),
            ("empty seq", lambda: [b"", b""]),
            ("9-byte seq", lambda: [b"", b"\x00" * 9]),
            ("long seq", lambda: [b"", os.urandom(rng.randint(10, 300))]),
            ("garbage frames", lambda: [os.urandom(rng.randint(0, 64)) for _ in range(rng.choice([1, 4, 5, 9]))]),
        ]
        n = 0
        while not self.stop.is_set():
            d = self.zc.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(self.rep_ep)
            for _ in range(20):
                n += 1
                if n % 60 == 0:
                    what, frames = "huge frame (4 MiB seq)", [b"", b"\x00" * (4 << 20)]
                else:
                    what, mk = kinds[rng.randrange(len(kinds))]
                    frames = mk()
                d.send_multipart(frames)
                self.count(f"zmq: malformed replay request: {what}")
                time.sleep(0.002)
            time.sleep(0.05)
            while True:
                try:
                    fr = d.recv_multipart(zmq.DONTWAIT)
                except zmq.Again:
                    break
                self.replied_to_bad.append(repr([f[:16] for f in fr[:4]]))
            d.close(0)

    def flood(self) -> None:
        """Valid replay requests in bulk from DEALERs that read part of the replies, or none, then leave."""
        rng = self.rng
        while not self.stop.is_set():
            d = self.zc.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.setsockopt(zmq.RCVHWM, rng.choice([1, 10, 1000]))
            d.connect(self.rep_ep)
            k = rng.randint(1, 8)
            for _ in range(k):
                d.send_multipart([b"", rng.choice([0, rng.randrange(0, 1 << 16), (1 << 64) - 2]).to_bytes(8, "big")])
            self.count("zmq: replay flood requests", k)
            for _ in range(rng.randint(0, 40)):
                try:
                    d.recv_multipart(zmq.DONTWAIT)
                except zmq.Again:
                    time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.1))
            d.close(0)

    def sub_churn(self) -> None:
        """SUBs connecting, subscribing, maybe reading one message, and leaving, in a loop."""
        rng = self.rng
        while not self.stop.is_set():
            s = self.zc.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SUBSCRIBE, rng.choice([b"", b"x", b"\xff" * 300]))
            s.connect(self.pub_ep)
            if rng.random() < 0.5:
                s.setsockopt(zmq.RCVTIMEO, 20)
                try:
                    s.recv_multipart()
                except zmq.Again:
                    pass
            else:
                time.sleep(rng.uniform(0, 0.02))
            s.close(0)
            self.count("zmq: SUB connect/disconnect cycles")

    def stuck_sub(self) -> None:
        """One SUB that never reads (receive HWM 1, a small kernel buffer): the daemon must cut it, not wait. It joins
        after the paused SUB's pause (4 s), whose own cut would otherwise hide behind this one's."""
        if self.stop.wait(4.5):
            return
        s = self.zc.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 2048)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(self.pub_ep)
        self.count("zmq: stuck SUB (never reads)")
        self.stop.wait()
        s.close(0)

    def raw_garbage(self) -> None:
        """Raw unix connections to the ZMTP endpoints writing bytes that are no ZMQ handshake, then closing."""
        rng = self.rng
        while not self.stop.is_set():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(0.5)
                try:
                    c.connect(rng.choice(self.paths))
                    r = rng.random()
                    if r < 0.3:
                        c.sendall(os.urandom(rng.randint(1, 4096)))
                    elif r < 0.6:
                        c.sendall(ZMTP_SIG + os.urandom(rng.randint(1, 200)))  # a greeting gone wrong
                    elif r < 0.8:
                        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    else:
                        c.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(500))  # TLS hello
                    if rng.random() < 0.5:
                        c.shutdown(socket.SHUT_WR)
                        while c.recv(4096):
                            pass
                except OSError:
                    pass
            self.count("zmq: raw garbage connections")
            time.sleep(0.005)

    def open_stallers(self, k: int) -> None:
        """``k`` connections to each endpoint that open and stall: silent, or a greeting's first 10 bytes only."""
        for path in self.paths:
            for i in range(k):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    c.connect(path)
                    if i % 2:
                        c.sendall(ZMTP_SIG)
                except OSError:
                    pass
                self.stallers.append(c)
        self.count("zmq: stalled connections (open, silent or half a greeting)", 2 * k)

    def close_stallers(self) -> None:
        for c in self.stallers:
            c.close()
        self.stallers.clear()

    def finish(self) -> None:
        self.stop.set()
        self.close_stallers()
        for t in self.threads:
            t.join(30)
        for what, n in self.counts.items():
            self.ctx.bad(what, n)
        for e in self.errors:
            self.ctx.fail("crashes", f"hostile ZMQ peer broke (the suite's bug): {e}")
        if self.replied_to_bad:
            self.ctx.fail("wrong_answers", f"{len(self.replied_to_bad)} replies to malformed replay requests (the "
                          f"contract: counted and ignored), e.g. {self.replied_to_bad[:3]}")


def judge_sub(ctx: Ctx, zc: Any, rep_ep: str, sub: SubJudge, who: str, published: list[tuple[int, str]],
              dropped: int, *, cut_ok: bool) -> None:
    """A subscriber's stream: every batch from the first it got, in order, once, byte-identical; a gap is a wrong
    answer unless kvshm counted a drop (or, ``cut_ok``, the daemon cut this subscriber for not reading: documented);
    a healthy DEALER's replay from the first gap (or of the last 50 batches) must fill it byte-identical, or the
    batches must be older than the oldest the buffer returned (said, counted)."""
    z = ctx.fig.zmq
    want = dict(published)
    if sub.bad:
        ctx.fail("wrong_answers", f"{who} got malformed messages: {sub.bad[:3]}")
    if not sub.got:
        ctx.fail("wrong_answers" if dropped == 0 else "losses",
                 f"{who} got none of {len(published)} batches (dropped counted: {dropped})")
        return
    first = sub.got[0][0]
    seqs = [s for s, _ in sub.got]
    if seqs != sorted(set(seqs)):
        ctx.fail("wrong_answers", f"{who} saw seqs out of order or twice: {seqs[:20]}...")
    wrong = [s for s, d in sub.got if want.get(s) != d]
    if wrong:
        ctx.fail("wrong_answers", f"{len(wrong)} batches at the {who} differ from msgspec's encoding of what was "
                 f"published (or were never published): seqs {wrong[:10]}")
    seen = set(seqs)
    missing = [s for s, _ in published if s >= first and s not in seen]
    z[f"{who}: received"] += len(sub.got)
    z[f"{who}: joined after"] += sum(1 for s, _ in published if s < first)
    z[f"{who}: missed"] += len(missing)
    if missing and dropped == 0 and not cut_ok:
        ctx.fail("wrong_answers", f"{who} missed {len(missing)} batches (e.g. seqs {missing[:10]}) and kvshm "
                 "counted no drop")
    start = missing[0] if missing else published[max(0, len(published) - 50)][0]
    got, why = zmq_replay(zc, rep_ep, start, 15)
    if got is None:
        ctx.fail("hangs", f"replay from {start} for the {who} after the hostiles left: {why}")
        return
    rep = dict(got)
    z["replays judged"] += 1
    z["batches replayed"] += len(got)
    oldest = got[0][0] if got else None
    for s in missing or [s for s, _ in published if s >= start]:
        if s in rep:
            z[f"{who}: gap batches filled by replay"] += 1 if missing else 0
            if rep[s] != want[s]:
                ctx.fail("wrong_answers", f"replayed batch {s} differs from msgspec's encoding")
                return
        elif oldest is not None and s < oldest:
            z[f"{who}: gap batches no longer in the replay buffer (said)"] += 1
        else:
            ctx.fail("wrong_answers", f"replay from {start} lacks batch {s} though it holds {oldest}..")
            return


def sc_zmq(ctx: Ctx) -> None:
    """A producer publishing vLLM-shaped batches on ZMQ (``publish=`` ipc:// in a private dir, ``apply_batch``) while
    hostile peers attack both endpoints; one healthy SUB must get every batch byte-identical to msgspec's encoding,
    gaps only where kvshm counted a drop, each gap filled by a healthy DEALER's replay (or honestly out of the
    buffer); the recovery judge for the same worker, ingest latency, and the leak check after the scenario."""
    zdir = tempfile.mkdtemp(prefix="zmq-", dir=ctx.work)  # 0700
    n_paced, n_burst = (1200, 3000) if ctx.short else (4000, 8000)
    with producer(ctx, 1, zmq_dir=zdir, buffer_steps=5000) as p:
        w = p.workers[0]
        pub_ep, rep_ep = f"ipc://{zdir}/pub-{w}.sock", f"ipc://{zdir}/replay-{w}.sock"
        zc = zmq.Context()
        sub = SubJudge(zc, pub_ep)
        slow = SubJudge(zc, pub_ep, rcvhwm=10)  # stops reading for 4 s mid-stream: the daemon cuts it (2 s)
        hostiles = ZmqHostiles(ctx, zc, pub_ep, rep_ep)
        published: list[tuple[int, str]] = []
        zstats: dict[str, Any] = {}
        try:
            time.sleep(0.3)  # the subscription reaches the daemon (PUB drops what it sends before)
            hostiles.start()
            ctx.fault("ZMQ publisher under hostile peers")
            slow.pause.set()
            threading.Timer(4.0, slow.pause.clear).start()
            for n, pace in ((n_paced, 2000), (n_burst, 0), (100, 40_000)):
                r = p.batch(w, n, pace)
                if r is None:
                    return
                published += [(int(s), d) for s, d in r["batches"]]
                zstats = r.get("zmq") or {}
            # Connections that open and stall, on both endpoints: new peers must still get in.
            ctx.scenario = "zmq:stall"
            hostiles.open_stallers(5 if ctx.short else 20)
            ctx.fault("ZMQ stalled connections")
            late = SubJudge(zc, pub_ep)
            t_end = time.monotonic() + 10
            while time.monotonic() < t_end and not late.got:
                r = p.batch(w, 12, 20_000)
                if r is None:
                    return
                published += [(int(s), d) for s, d in r["batches"]]
                zstats = r.get("zmq") or {}
            late.stop.set()
            late.t.join(5)
            if not late.got:
                ctx.fail("hangs", f"a SUB connecting while {len(hostiles.stallers)} connections stall got nothing "
                         "in 10 s (its handshake waits behind theirs)")
            got, why = zmq_replay(zc, rep_ep, published[-5][0], 10)
            if got is None:
                ctx.fail("hangs", f"a healthy replay while {len(hostiles.stallers)} connections stall: {why}")
            if late.got and got is not None:
                ctx.fig.zmq["a SUB and a replay got in past stalled connections"] += 1
            hostiles.close_stallers()
            ctx.scenario = "zmq"
            r = p.batch(w, 200, 1000)
            if r is None:
                return
            published += [(int(s), d) for s, d in r["batches"]]
            zstats = r.get("zmq") or {}
        finally:
            hostiles.finish()
            ctx.scenario = "zmq"
        # The healthy subscriber: every batch from the first it got, in order, byte-identical; gaps only if counted.
        last = published[-1][0]
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and any(not sj.got or sj.got[-1][0] < last for sj in (sub, slow)):
            time.sleep(0.05)
        for sj in (sub, slow):
            sj.stop.set()
            sj.t.join(5)
        zc_stats = p.call({"op": "stats", "worker": w}) or {}
        zstats = (zc_stats.get("stats") or {}).get("zmq") or zstats
        dropped = int(zstats.get("dropped", 0))
        if VERBOSE:
            print(f"    [zmq] worker {w}: {len(published)} batches published; daemon zmq stats {zstats}", flush=True)
        ctx.fig.zmq["batches published"] += len(published)
        ctx.fig.zmq["drops counted"] += dropped
        k = "healthy SUB: longest wait between two messages (ms, max over runs)"
        ctx.fig.zmq[k] = max(ctx.fig.zmq[k], int(sub.max_gap * 1000))
        if VERBOSE:
            print(f"    [zmq] longest wait between two messages: healthy SUB {sub.max_gap:.2f} s, paused SUB "
                  f"{slow.max_gap:.2f} s", flush=True)
        judge_sub(ctx, zc, rep_ep, sub, "healthy SUB", published, dropped, cut_ok=False)
        judge_sub(ctx, zc, rep_ep, slow, "paused SUB", published, dropped, cut_ok=True)
        zc.term()
        judge(ctx, w, "ZMQ hostile peers")


SCENARIOS: list[tuple[str, Callable[..., None], bool]] = [  # name, function, takes the base producer
    ("socket_hostile", sc_socket_hostile, False),
    ("conn_cycles", sc_conn_cycles, False),
    ("http_hostile", sc_http_hostile, False),
    ("ring_scribble", sc_ring_scribble, False),
    ("ring_truncate", sc_ring_truncate, False),
    ("daemon_kill", sc_daemon_kill, True),
    ("daemon_stop", sc_daemon_stop, False),
    ("hostile_detach", sc_hostile_detach, False),
    ("ckpt_corrupt", sc_ckpt_corrupt, True),
    ("producer_kill", sc_producer_kill, False),
    ("producer_stop", sc_producer_stop, False),
    ("many_workers", sc_many_workers, False),
    ("tmpfs_state", sc_tmpfs_state, False),
    ("zmq", sc_zmq, False),
]


# ---------------------------------------------------------------------------------------------------- main
def run(ctx: Ctx, seconds: float) -> None:
    sock_dir = tempfile.mkdtemp(prefix="sock-", dir=ctx.work)
    os.makedirs(os.path.join(ctx.work, "rings"), mode=0o700)
    state_dir = os.path.join(ctx.work, "state")
    ctx.daemon = Daemon(ctx, os.path.join(sock_dir, "kvshmd.sock"), state_dir, "200ms")
    base = Producer(ctx, [1, 2])
    t_end = time.monotonic() + seconds
    cycle = 0
    try:
        publish_some(ctx, base, 100)
        for w in base.workers:
            judge(ctx, w, "start")
        d = ctx.daemon
        d.base_fds, d.base_rss = d.fds(), d.rss()
        while True:
            cycle += 1
            order = list(SCENARIOS)
            if cycle > 1:
                ctx.rng.shuffle(order)
            for name, fn, wants_base in order:
                if time.monotonic() > t_end and cycle > 1:
                    return
                if name == "tmpfs_state" and cycle > 1 and ctx.rng.random() < 0.7:
                    continue  # slow to set up: one in three cycles after the first
                ctx.scenario = name
                ctx.fig.scenario_runs[name] += 1
                t0 = time.monotonic()
                try:
                    fn(ctx, base) if wants_base else fn(ctx)
                except Exception as e:  # a scenario that breaks is a failure of the suite or of kvshm: say which
                    ctx.fail("crashes", f"scenario raised {e!r}: {traceback.format_exc()[-1500:]}")
                assert ctx.daemon is not None
                if not ctx.daemon.alive():
                    restart_daemon(ctx, ctx.daemon)
                # The base producer keeps publishing between faults and is judged after each.
                if not base.check():
                    ctx.lives[1] = ctx.lives.get(1, 0) + 1
                    ctx.lives[2] = ctx.lives.get(2, 0) + 1
                    base = Producer(ctx, [1, 2])
                publish_some(ctx, base, 20)
                for w in base.workers:
                    judge(ctx, w, f"scenario {name}")
                for w in base.workers:
                    if w in ctx.tainted:  # the engine's next Cleared re-bases it: from then on, complete again
                        base.clear(w)
                        base.pub(w, 20)
                        ctx.tainted.discard(w)
                        judge(ctx, w, f"a Cleared after the losses of {name}")
                leak_check(ctx, name)
                print(f"  cycle {cycle} {name}: {time.monotonic() - t0:.1f} s; failures so far "
                      f"{dict(ctx.fig.failures)} known {dict(ctx.fig.known)}", flush=True)
    finally:
        ctx.scenario = "teardown"
        base.quit()
        forget(ctx, base.workers)
        if ctx.daemon is not None:
            leak_check(ctx, "the end", final=True)
            ctx.daemon.stop()


def leak_check(ctx: Ctx, after: str, *, final: bool = False) -> None:
    """The daemon's fds and RSS at a quiet point against its baseline (same attached producers)."""
    d = ctx.daemon
    assert d is not None
    if not d.alive():
        return
    if d.base_fds is None:
        time.sleep(0.3)
        d.base_fds, d.base_rss = d.fds(), d.rss()
        return
    fds = d.fds()
    for _ in range(20):
        if fds <= d.base_fds + 4:
            break
        time.sleep(0.25)  # connections being closed
        fds = d.fds()
    rss = d.rss()
    assert d.base_rss is not None
    if fds > d.base_fds + 4:
        ctx.fail("leaks", f"kvshmd {d.pid} fds {d.base_fds} -> {fds} after {after}")
    if rss > max(2 * d.base_rss, d.base_rss + (96 << 20)):
        ctx.fail("leaks", f"kvshmd {d.pid} RSS {d.base_rss >> 20} MiB -> {rss >> 20} MiB after {after}")
    ctx.fig.details.append(f"[leak check] after {after}: kvshmd {d.pid} fds {d.base_fds} -> {fds}, "
                           f"RSS {d.base_rss >> 20} -> {rss >> 20} MiB") if final else None


def report(ctx: Ctx, seconds: float, elapsed: float, path: str | None) -> int:
    f = ctx.fig
    lines = [
        f"seed {ctx.seed}; ran {elapsed:.0f} s (asked {seconds:.0f} s); kvshmd {ctx.kvshmd}",
        f"faults injected: {sum(f.faults.values())}",
        f"bad inputs tried: {sum(f.bad_inputs.values())}",
        f"recoveries judged: {f.judged} ({f.reported} answers reported incomplete, "
        f"{f.error_answers} Error answers while waiting)",
        f"wrong answers: {f.failures['wrong_answers']}",
        f"hangs: {f.failures['hangs']}",
        f"crashes: {f.failures['crashes']}",
        f"leaks: {f.failures['leaks']}",
        f"losses where none is promised (reported, not silent): {f.failures['losses']}",
        f"known failures (filed defects, not counted above): {sum(f.known.values())} {dict(f.known) or ''}",
        f"worst publish latency: {f.worst_pub_ns / 1e3:.0f} µs (by scenario: "
        + ", ".join(f"{k} {v / 1e3:.0f}" for k, v in sorted(f.worst_pub_by.items())) + ")",
        "answers reported incomplete, by scenario: "
        + (", ".join(f"{k} {v}" for k, v in sorted(f.reported_by.items())) or "none"),
        "ZMQ (healthy SUB and DEALER): " + (", ".join(f"{k} {v}" for k, v in f.zmq.items()) or "not run"),
        "scenario runs: " + ", ".join(f"{k} {v}" for k, v in sorted(f.scenario_runs.items())),
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(f.faults.items())),
        "bad inputs: " + ", ".join(f"{k} {v}" for k, v in sorted(f.bad_inputs.items())),
    ]
    print("\n== kvshm soak figures")
    for ln in lines:
        print(ln)
    if f.details:
        print("\n== details")
        for d in f.details:
            print(d[:3000])
    failed = sum(f.failures.values())
    if path:
        block = ["<!-- soak:begin -->", "```", *lines, "```", ""]
        if f.details:
            block += ["Details:", "", *("- " + d[:1500].replace("\n", " ") for d in f.details), ""]
        block.append("<!-- soak:end -->")
        text = open(path).read() if os.path.exists(path) else "<!-- soak:begin -->\n<!-- soak:end -->\n"
        a, b = text.find("<!-- soak:begin -->"), text.find("<!-- soak:end -->")
        if a < 0 or b < 0:
            text += "\n<!-- soak:begin -->\n<!-- soak:end -->\n"
            a, b = text.find("<!-- soak:begin -->"), text.find("<!-- soak:end -->")
        text = text[:a] + "\n".join(block) + text[b + len("<!-- soak:end -->"):]
        with open(path, "w") as fh:
            fh.write(text)
    verdict = "FAILED" if failed else "passed"
    print(f"\nsoak {verdict}: {failed} failures; seed {ctx.seed} (SOAK_SEED={ctx.seed} replays)")
    return 1 if failed else 0


def parse_duration(s: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(s[:-1]) * units[s[-1]] if s and s[-1] in units else float(s)


def find_kvshmd() -> str:
    import kvshm  # type: ignore[import-not-found,unused-ignore]  # the installed wheel

    p = os.path.join(os.path.dirname(kvshm.__file__), "_bin", "kvshmd")
    if os.access(p, os.X_OK):
        return p
    found = shutil.which("kvshmd")
    if not found:
        raise SystemExit("soak: no kvshmd (install the wheel: make wheel)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time", default="30m", help="how long to keep cycling through the scenarios (e.g. 90s, 30m)")
    ap.add_argument("--seed", type=int, default=None, help="replay a run (printed at the start)")
    ap.add_argument("--short", action="store_true", help="one pass of every scenario, smaller sizes")
    ap.add_argument("--report", default=None, help="write the figures into this file (between its soak markers)")
    ap.add_argument("--kvshmd", default=None)
    ap.add_argument("--only", default="", help="comma-separated scenario names (debugging)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    seconds = parse_duration(a.time)
    kvshmd = a.kvshmd or find_kvshmd()
    work = tempfile.mkdtemp(prefix="kvshm-soak-")
    os.chmod(work, 0o700)
    print(f"kvshm soak: seed {seed}, {seconds:.0f} s, work dir {work}, kvshmd {kvshmd}", flush=True)
    ctx = Ctx(seed, kvshmd, work, os.environ.get("SOAK_STRICT") == "1", a.short)
    if a.only:
        keep = set(a.only.split(","))
        SCENARIOS[:] = [s for s in SCENARIOS if s[0] in keep]
    t0 = time.monotonic()
    try:
        run(ctx, seconds)
    finally:
        for p in ctx.procs:  # every child, by pid
            if p.poll() is None:
                ctx.fail("leaks", f"process {p.pid} ({p.args!r:.200}) "
                         "still running at the end: killed")
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        rings = os.listdir(os.path.join(work, "rings")) if os.path.isdir(os.path.join(work, "rings")) else []
        rings = [r for r in rings if r not in ctx.dead_rings]
        if rings:
            ctx.fail("leaks", f"ring files left behind by producers that shut down: {rings[:5]}")
    rc = report(ctx, seconds, time.monotonic() - t0, a.report)
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept for inspection: {work}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
