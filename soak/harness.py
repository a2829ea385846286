"""The soak's harness: its figures and context, kvshmd and producer processes, raw socket and HTTP clients, and the
judge (a consumer's rebuilt state against the engine's true state, ``model.Truth``). Scenarios live in ``sc_*.py``;
``soak.py`` runs them.

The plumbing is kvshm_testkit's (testkit/README.md): each kvshmd life is a ``Kvshmd``, each child a ``Proc`` with
JSON-line pipes, HTTP its ``http_get``. Requests kvshm's own client speaks (HEALTH) go through ``kvshm._client``;
the raw frames here (:func:`rpc`, :func:`read_frame`) are for what it does not: hostile frames and FORGET."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testkit"))
from model import AnswerError, StreamGen, Tree, Truth, consume  # noqa: E402

from kvshm._client import Client, ClientError, FrameError, Kind, RemoteError, encode_frame  # noqa: E402
from kvshm_testkit import Kvshmd, Proc, Timeout, rss_bytes  # noqa: E402
from kvshm_testkit import http_get as kit_http_get  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FRAME = struct.Struct("<IBBH")  # the frame header (proto/sock/PROTOCOL.md), for the hostile frames
K_ATTACH, K_DETACH, K_EVENTS, K_DUMP, K_STATS, K_MATCH, K_HEALTH = (int(k) for k in Kind)
K_FORGET = 8  # not a kind of kvshm's client (an operator's request): only raw frames ask it
BLOCK = 4
VERBOSE = os.environ.get("SOAK_VERBOSE") == "1"
JUDGE_DEADLINE = 20.0  # seconds a consumer may take to converge after a fault before it counts as a hang

# Scenarios whose failures are a defect already filed and not yet fixed on the merged code: their failures are
# counted apart (known) and do not fail the run; SOAK_STRICT=1 counts them as failures. Each names its defect.
KNOWN: dict[str, str] = {
    "ring_truncate:publish": "a truncated ring file, producer side, file rings only (LocalIndexer(ring_dir=...) or "
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
        # Publishing workers: kvshmd's wire seq of each batch -> the engine seq of its last event (docs/lifecycle.md:
        # /kv_recover speaks wire seqs there); the judge translates an answer's ids through it.
        self.wire: dict[int, dict[int, int]] = {}
        # Workers whose producer the soak killed: the incarnation ended, so the stream must end with a Cleared under
        # the id after the engine's last (docs/lifecycle.md), none of its blocks left.
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


class Daemon:
    """One kvshmd life (restarts make new objects sharing the socket and state dir), a ``Kvshmd`` of its own log
    (``kvshmd-<µs>.log`` in the work dir) healthy within 15 s; its process is counted in ctx.procs."""

    def __init__(self, ctx: Ctx, sock: str, state_dir: str, ckpt: str, extra: list[str] | None = None) -> None:
        self.ctx = ctx
        self.sock = sock
        self.state_dir = state_dir
        self.log_path = os.path.join(ctx.work, f"kvshmd-{int(time.time() * 1e6)}.log")
        flags = ["--log-format", "json", "--frame-timeout", "2s", "--idle-timeout", "20s", "--write-timeout", "5s",
                 "--pid-check-interval", "200ms"]
        if state_dir:
            flags += ["--state-dir", state_dir]
            if ckpt:
                flags += ["--checkpoint-interval", ckpt]
        flags += extra or []
        self.k = Kvshmd(ctx.kvshmd, Path(sock).parent, socket=Path(sock), log=Path(self.log_path), flags=flags,
                        runtime_dir=False)
        try:
            self.k.start(15.0)
        except Timeout as e:
            raise RuntimeError(f"kvshmd did not come up: {self.log_text()[-2000:]}") from e
        finally:
            if self.k.proc is not None:
                ctx.procs.append(self.k.proc.popen)
        assert self.k.proc is not None
        self.p = self.k.proc.popen
        self.pid = self.p.pid
        self.http = self.k.http
        self.expected_exit = False
        self.base_fds: int | None = None
        self.base_rss: int | None = None
        self.seen: dict[str, int] = {}

    def log_text(self) -> str:
        return self.k.log_text()

    def alive(self) -> bool:
        return self.k.alive()

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.expected_exit = True
            self.k.kill()  # and reaped
        elif self.alive():
            self.k.send(signal.Signals(sig))

    def stop(self) -> None:
        self.expected_exit = True
        rc = self.k.stop(10.0)
        if rc is None:
            self.ctx.fail("hangs", f"kvshmd {self.pid} ignored SIGTERM for 10 s")
        elif rc != 0:
            self.ctx.fail("crashes", f"kvshmd {self.pid} exited {rc} at SIGTERM: {self.log_text()[-1500:]}")

    def reap(self) -> None:
        """Release a life that ended by itself (its log, its entry among the kit's live children)."""
        if self.k.proc is not None and not self.alive():
            self.k.proc.reap()

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
        return rss_bytes(self.pid)


class Piped:
    """A child process of the soak speaking JSON lines (a kit ``Proc`` with pipes), its stderr in a log file of the
    work dir; counted in ctx.procs so the leak check finds it."""

    def _start(self, ctx: Ctx, argv: list[str], errlog: str, env: dict[str, str] | None) -> None:
        self.proc = Proc(os.path.basename(argv[1]) if len(argv) > 1 else argv[0], argv, Path(errlog), env=env,
                         pipes=True)
        self.p = self.proc.popen
        ctx.procs.append(self.p)

    def _line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line within ``timeout`` s; None when the child closed its stdout (exited). Raises Timeout."""
        try:
            return self.proc.ask(None, timeout)
        except RuntimeError:
            return None

    def _write(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def stderr(self) -> str:
        return self.proc.log_text()


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
            out = self._line(timeout)
        except Timeout:
            self.ctx.fail("hangs", f"producer {self.pid} gave no reply in {timeout} s")
            return None
        if out is None:
            self.check()
        return out

    def send(self, cmd: dict[str, Any]) -> None:
        self._write(json.dumps(cmd))
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
        self.proc.send(signal.SIGKILL)
        self.proc.reap()
        for w in self.workers:
            self.ctx.acked[w] = None  # unknown: the judge takes the answer's last_event_id
            self.ctx.ended.add(w)

    def quit(self) -> None:
        if self.dead:
            stop_pid(self.p, grace=2)
            self.proc.reap()
            return
        r = self.call({"op": "quit"}, timeout=30)
        self.dead = True
        if r is None or not r.get("bye"):
            if self.p.poll() is None:
                self.ctx.fail("hangs", f"producer {self.pid} did not quit")
        rc = stop_pid(self.p, grace=10)
        if rc not in (0, None) and rc != -signal.SIGTERM:
            self.ctx.fail("crashes", f"producer {self.pid} exited {rc} at quit: {self.stderr()[-1500:]}")
        self.proc.reap()


# ---------------------------------------------------------------------------------------------------- clients
def rpc(sock: str, kind: int, body: bytes, timeout: float = 10.0) -> tuple[int, int, int, bytes]:
    """One raw request (kvshm's own frame, ``encode_frame``) on a fresh connection; returns (version, kind, status,
    body) of the reply as it came, unchecked: for the kinds and replies kvshm's client does not speak or accept."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(encode_frame(kind, body))
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
        with Client(d.sock, connect_timeout=timeout, timeout=timeout) as c:
            c.health()
        return True
    except (RemoteError, FrameError) as e:  # an answer, and a wrong one
        ctx.fail("wrong_answers", f"HEALTH after {what}: {e}")
        return True
    except (ClientError, OSError) as e:
        if d.check():
            ctx.fail("hangs", f"HEALTH after {what} failed after {time.monotonic() - t0:.1f} s: {e!r}")
        return False


def http_get(addr: str, path: str, timeout: float = 15.0) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` of ``addr`` (host:port): (status, lower-cased headers, body); status 0 when nothing answered."""
    r = kit_http_get(f"http://{addr}{path}", timeout)
    return r.status, r.headers, r.body if r.status else r.error.encode()


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
        status, hdrs, body = http_get(d.http, path)
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
    old.reap()
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
            out = self._line(timeout)
        except Timeout:
            self.ctx.fail("hangs", f"{self.name} {self.p.pid} gave no reply in {timeout} s")
            return None
        if out is None:
            self.p.wait()
            self.ctx.fail("crashes", f"{self.name} {self.p.pid} died with {self.p.returncode}: "
                          f"{self.stderr()[-1500:]}")
        return out

    def call(self, cmd: dict[str, Any] | str, timeout: float = 60) -> dict[str, Any] | None:
        try:
            self._write(cmd if isinstance(cmd, str) else json.dumps(cmd))
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
        self.proc.reap()
