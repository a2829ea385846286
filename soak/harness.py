"""The soak's harness: its figures and context, kvshmd and producer processes, raw socket and HTTP clients, and the
judge (a consumer's rebuilt state against the engine's true state, ``model.Truth``). Scenarios live in ``sc_*.py``;
``soak.py`` runs them."""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
if os.environ.get("SOAK_KNOWN") is not None:  # e.g. SOAK_KNOWN= (empty): every known defect counts as a failure
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
    limits: Counter[str] = field(default_factory=Counter)  # what the shared daemon did with each huge ask
    plugin: Counter[str] = field(default_factory=Counter)  # the vLLM plugin's batches: good, bad, contained


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
        # Publishing workers: kvshmd's wire seq of each batch -> the engine seq of its last event (LIFECYCLE.md:
        # /kv_recover speaks wire seqs there); the judge translates an answer's ids through it.
        self.wire: dict[int, dict[int, int]] = {}
        # Workers whose producer the soak killed: the incarnation ended, so the stream must end with a Cleared under
        # the id after the engine's last (LIFECYCLE.md), none of its blocks left.
        self.ended: set[int] = set()
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


# kvshmd's --max-memory in the soak: its RSS must stay under it whatever hostile peers do (scenario zmq_peers).
DAEMON_MAX_MEMORY = 512 << 20


class Daemon:
    """One kvshmd life (restarts make new objects sharing the socket and state dir)."""

    def __init__(self, ctx: Ctx, sock: str, state_dir: str, ckpt: str, extra: list[str] | None = None) -> None:
        self.ctx = ctx
        self.sock = sock
        self.state_dir = state_dir
        self.log_path = os.path.join(ctx.work, f"kvshmd-{int(time.time() * 1e6)}.log")
        args = [ctx.kvshmd, "serve", "--socket", sock, "--http", "127.0.0.1:0", "--log-format", "json",
                "--frame-timeout", "2s", "--idle-timeout", "20s", "--write-timeout", "5s",
                "--pid-check-interval", "200ms", "--max-memory", f"{DAEMON_MAX_MEMORY >> 20}MiB"]
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


class Piped:
    """A child process of the soak speaking JSON lines on stdout (read by a thread into ``lines``), its stderr in a
    log file of the work dir; counted in ctx.procs so the leak check finds it."""

    def _start(self, ctx: Ctx, argv: list[str], errlog: str, env: dict[str, str] | None) -> None:
        self.errlog = open(errlog, "wb")
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errlog, env=env)
        ctx.procs.append(self.p)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line.decode())
        self.lines.put(None)

    def stderr(self) -> str:
        with open(self.errlog.name, "rb") as f:
            return f.read().decode(errors="replace")


class Producer(Piped):
    """A producer process (``producer.py``) with one LocalIndexer per worker."""

    def __init__(self, ctx: Ctx, workers: list[int], *, ring_bytes: int = 1 << 20, memfd: bool = False,
                 zmq_dir: str | None = None, buffer_steps: int = 10_000) -> None:
        self.ctx = ctx
        self.workers = workers
        assert ctx.daemon is not None
        pairs = ",".join(f"{w}:{ctx.lives.setdefault(w, 0)}" for w in workers)
        for w in workers:
            ctx.tainted.discard(w)  # a new producer: a new epoch, the stream starts empty
            ctx.ended.discard(w)
            ctx.truths[w] = Truth(StreamGen(ctx.seed, w, ctx.lives[w], BLOCK))
            ctx.warm[w] = Tree()
            ctx.acked[w] = None
        errlog = os.path.join(ctx.work, f"producer-{workers[0]}-{ctx.lives[workers[0]]}.log")
        # File rings in the work dir (the leak check counts them), or LocalIndexer's default: a sealed memfd.
        env = dict(os.environ, KVSHM_RING_DIR=os.path.join(ctx.work, "rings"))
        if memfd:
            del env["KVSHM_RING_DIR"]
        self._start(ctx, [
            sys.executable, os.path.join(HERE, "producer.py"), "--socket", ctx.daemon.sock, "--seed", str(ctx.seed),
            "--workers", pairs, "--block-size", str(BLOCK), "--ring-bytes", str(ring_bytes),
            *(["--zmq-dir", zmq_dir, "--buffer-steps", str(buffer_steps)] if zmq_dir else [])], errlog, env)
        self.pid = self.p.pid
        self.dead = False
        self.rings: dict[int, str] = {}
        ready = self._get(30)
        if ready is None or not ready.get("ready"):
            raise RuntimeError(f"producer {self.pid} did not start: {self.stderr()[-1500:]}")
        self.rings = {int(w): r for w, r in ready["rings"].items()}
        self.outstanding = 0

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
            self.ctx.ended.add(w)

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
                had, _ = engine_id(ctx, w, state.last)
                if had is not None and (acked is None or had >= acked):
                    new = state  # nothing newer to learn: judge the state it has
                    variant = "Events"
                else:
                    problem = f"TooNew for start={start} (acked {acked}): {body[:300]!r}"
            if variant in ("Events", "TreeDump"):
                last, bad_id = engine_id(ctx, w, new.last)
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
                if w in ctx.ended and not bad_id:
                    if new.blocks or last is None or not truth.seq_exists(last - 1):
                        problem = (f"{variant} (last_event_id {last}, {len(new.blocks)} blocks) is not the ended "
                                   "incarnation's end: a Cleared under the id after the engine's last")
                    else:
                        ctx.fig.judged += 1
                        ctx.warm[w] = new
                        return
                elif acked is not None and (last is None or last < acked) and not bad_id:
                    problem = f"{variant} ends at id {last}, the producer published up to {acked}"
                else:
                    ctx.fig.judged += 1
                    diff = bad_id or truth.at(last).diff(new)
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
            kind = "wrong_answers" if "published up to" in problem or "incarnation's end" in problem else "hangs"
            ctx.fail(kind, f"{who}: not converged in {deadline:.0f} s: {problem}")
            ctx.warm[w] = Tree()
            return
        if not d.check():
            return
        time.sleep(0.1)


def engine_id(ctx: Ctx, w: int, wire: int | None) -> tuple[int | None, str]:
    """An answer's id in the engine's numbering: itself, or on a publishing worker (``ctx.wire``) the engine seq of
    the batch kvshmd published under it; an id below every known batch is the incarnation's start Cleared (before
    any event: None). The str says why an id is no batch's (a wrong answer)."""
    m = ctx.wire.get(w)
    if m is None or wire is None:
        return wire, ""
    if wire in m:
        return m[wire], ""
    if not m or wire < min(m):
        return None, ""
    return None, f"last_event_id {wire} is no wire seq kvshmd published a batch of worker {w} under"


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
        for m in (ctx.truths, ctx.warm, ctx.acked, ctx.wire):
            m.pop(w, None)
        ctx.ended.discard(w)


def publish_some(ctx: Ctx, p: Producer, n: int, pace_us: int = 0) -> None:
    for w in p.workers:
        p.pub(w, n, pace_us)


def restart_daemon(ctx: Ctx, old: Daemon) -> None:
    old.check()
    try:
        old.log.close()
    except OSError:
        pass
    ctx.daemon = Daemon(ctx, old.sock, old.state_dir, "200ms")
    healthy(ctx, "restart")


class Child(Piped):
    """A soak child speaking JSON lines (``asker.py``, ``plugin_child.py``): started by pid, counted in ctx.procs."""

    def __init__(self, ctx: Ctx, script: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.ctx = ctx
        self.name = script
        self._start(ctx, [sys.executable, os.path.join(HERE, script), *args],
                    os.path.join(ctx.work, f"{script}-{int(time.time() * 1e6)}.log"), env)

    def get(self, timeout: float = 60) -> dict[str, Any] | None:
        """The next reply, or None (a hang or a death, counted, with the child's stderr)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.ctx.fail("hangs", f"{self.name} {self.p.pid} gave no reply in {timeout} s")
            return None
        if line is None:
            self.p.wait()
            self.ctx.fail("crashes", f"{self.name} {self.p.pid} died with {self.p.returncode}: "
                          f"{self.stderr()[-1500:]}")
            return None
        out: dict[str, Any] = json.loads(line)
        return out

    def call(self, cmd: dict[str, Any] | str, timeout: float = 60) -> dict[str, Any] | None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(((cmd if isinstance(cmd, str) else json.dumps(cmd)) + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        return self.get(timeout)

    def finish(self) -> None:
        """Close stdin (the child shuts down and exits), then stop it by its pid."""
        try:
            assert self.p.stdin is not None
            self.p.stdin.close()
        except OSError:
            pass
        try:
            rc: int | None = self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.ctx.fail("hangs", f"{self.name} {self.p.pid} did not exit 30 s after its stdin closed")
            rc = stop_pid(self.p, grace=5)
        if rc not in (0, None):
            self.ctx.fail("crashes", f"{self.name} {self.p.pid} exited {rc}: {self.stderr()[-1500:]}")
        self.errlog.close()
