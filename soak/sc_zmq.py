"""Scenario zmq (issue 12): kvshmd's ZMQ publisher (PUB + replay ROUTER) under hostile peers, judged by a healthy
subscriber and a healthy replay DEALER against msgspec's encoding of what the producer published, under kvshmd's
wire seqs (docs/lifecycle.md: its own counter, its own heartbeats and incarnation Cleareds in the stream)."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec  # the soak venv installs it with pyzmq
import zmq  # pyzmq: the ZMQ scenario's peers; the soak venv installs it with msgspec
from harness import (
    VERBOSE,
    Ctx,
    judge,
    producer,
)

END_SEQ = b"\xff" * 8
ZMTP_SIG = b"\xff" + b"\x00" * 8 + b"\x7f"  # a ZMTP 3 greeting's first 10 bytes (what libzmq sends first)


def _digest(b: bytes) -> str:
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def zmq_replay(zc: Any, ep: str, start: int, timeout: float) -> tuple[list[tuple[int, str]] | None, str]:
    """A healthy DEALER's replay from ``start``: [(seq, payload digest)] up to the end marker, or None and why.
    Empty batches are left out: kvshmd fills a reply's heartbeat seqs with them (docs/replay-snapshots.md,
    "Contiguous replies"), and the judges compare replies with what was published."""
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
            if kvshmd_batch(fr[3]) != "heartbeat":
                out.append((int.from_bytes(fr[2], "big"), _digest(fr[3])))
    finally:
        d.close(0)


def kvshmd_batch(payload: bytes) -> str:
    """What kvshmd publishes on its own (docs/lifecycle.md): "heartbeat" (a batch with no events, on an idle stream),
    "cleared" (``[AllBlocksCleared]``: an incarnation's start or end), else ""."""
    try:
        _, events, _ = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError):
        return ""
    if events == []:
        return "heartbeat"
    if events in ([{"type": "AllBlocksCleared"}], [["AllBlocksCleared"]]):
        return "cleared"
    return ""


class SubJudge:
    """The healthy subscriber: reads every message into memory in its own thread; ``own`` holds the wire seqs of
    kvshmd's own batches (seq -> heartbeat or cleared)."""

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
        self.own: dict[int, str] = {}
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
            seq = int.from_bytes(fr[1], "big")
            if kind := kvshmd_batch(fr[2]):
                self.own[seq] = kind
            self.got.append((seq, _digest(fr[2])))
        self.s.close(0)

    def has(self, digest: str) -> bool:
        return any(d == digest for _, d in self.got[-500:])


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
              dropped: int, ring_dropped: int, *, cut_ok: bool) -> None:
    """A subscriber's stream under kvshmd's wire seqs (docs/lifecycle.md): seqs strictly increase and, when nothing was
    dropped or cut, go up by exactly 1 (every batch kvshmd publishes takes the next seq); every batch from the first
    published one it got is the next published payload, in order, once, byte-identical, except kvshmd's own
    heartbeats and incarnation Cleareds; a gap is a wrong answer unless kvshm counted a drop (or, ``cut_ok``, the
    daemon cut this subscriber for not reading: documented); a healthy DEALER's replay from the seq after the last
    batch before the first gap (or of the last 50 batches) must fill it byte-identical under the same seqs, or the
    batches must be older than the oldest the buffer returned (said, counted). ``published`` holds (engine seq,
    payload digest) pairs: only the digests and their order count. ``ring_dropped``: batches the producer found no
    room for in its ring (counted in its ``stats()["dropped_events"]``): they never reach kvshmd, whose LOSS record
    gives them their wire seqs, so a subscriber and a replay miss exactly those (a hole, not a wrong answer)."""
    z = ctx.fig.zmq
    pos = {d: i for i, (_, d) in enumerate(published)}
    if sub.bad:
        ctx.fail("wrong_answers", f"{who} got malformed messages: {sub.bad[:3]}")
    seqs = [s for s, _ in sub.got]
    if any(b <= a for a, b in zip(seqs, seqs[1:])):
        ctx.fail("wrong_answers", f"{who} saw wire seqs not strictly increasing: {seqs[:20]}...")
    holes = [(a, b) for a, b in zip(seqs, seqs[1:]) if b != a + 1]
    if holes and dropped == 0 and ring_dropped == 0 and not cut_ok:
        ctx.fail("wrong_answers", f"{who}: wire seqs skip (e.g. {holes[:5]}) though kvshm counted no drop")
    strangers = [s for s, d in sub.got if d not in pos and s not in sub.own]
    if strangers:
        ctx.fail("wrong_answers", f"{len(strangers)} batches at the {who} differ from msgspec's encoding of what was "
                 f"published (or were never published): seqs {strangers[:10]}")
    ours = [(s, pos[d]) for s, d in sub.got if d in pos]  # (wire seq, position in published)
    z[f"{who}: kvshmd's own batches (heartbeats, Cleareds)"] += len(sub.own)
    if not ours:
        ctx.fail("wrong_answers" if dropped == 0 else "losses",
                 f"{who} got none of {len(published)} batches (dropped counted: {dropped})")
        return
    at = [i for _, i in ours]
    if any(b <= a for a, b in zip(at, at[1:])):
        ctx.fail("wrong_answers", f"{who} saw published batches out of order or twice: positions {at[:20]}...")
    first = at[0]
    seen = set(at)
    missing = [i for i in range(first, len(published)) if i not in seen]
    z[f"{who}: received"] += len(ours)
    z[f"{who}: joined after"] += first
    z[f"{who}: missed"] += len(missing)
    if missing and dropped == 0 and ring_dropped == 0 and not cut_ok:
        ctx.fail("wrong_answers", f"{who} missed {len(missing)} batches (e.g. positions {missing[:10]}) and kvshm "
                 "counted no drop")
    if missing:
        start = max(s for s, i in ours if i < missing[0]) + 1
        want = missing
    else:
        start, i0 = ours[max(0, len(ours) - 50)]
        want = list(range(i0, len(published)))
    got, why = zmq_replay(zc, rep_ep, start, 15)
    if got is None:
        ctx.fail("hangs", f"replay from {start} for the {who} after the hostiles left: {why}")
        return
    z["replays judged"] += 1
    z["batches replayed"] += len(got)
    rseqs = [s for s, _ in got]
    if any(b <= a for a, b in zip(rseqs, rseqs[1:])) or (rseqs and rseqs[0] < start):
        ctx.fail("wrong_answers", f"replay from {start}: seqs not strictly increasing from it: {rseqs[:10]}")
        return
    # The buffer holds the incarnation's batches in order, its start Cleared (kvshmd's own) at most first.
    rat = [(s, pos.get(d)) for s, d in got]
    known = [i for _, i in rat if i is not None]
    foreign = [k for k, (_, i) in enumerate(rat) if i is None]
    suffix = known == list(range(known[0], len(published))) if known else True
    if ring_dropped:  # the ring's losses are holes in the buffer too: in order, up to the last batch published
        suffix = not known or (known == sorted(set(known)) and known[-1] == len(published) - 1)
    if foreign not in ([], [0]) or not suffix:
        ctx.fail("wrong_answers", f"replay from {start} is not the published batches' suffix in order: "
                 f"positions {[i for _, i in rat][:12]}...")
        return
    rep = {i: s for s, i in rat if i is not None}
    live = {i: s for s, i in ours}
    moved = [i for i in rep if i in live and rep[i] != live[i]]
    if moved:
        ctx.fail("wrong_answers", f"replayed batches under other seqs than the {who} got them: positions {moved[:5]}")
        return
    oldest = min(rep) if rep else None
    for i in want:
        if i in rep:
            z[f"{who}: gap batches filled by replay"] += 1 if missing else 0
        elif oldest is not None and i < oldest:
            z[f"{who}: gap batches no longer in the replay buffer (said)"] += 1
        elif ring_dropped:
            z[f"{who}: gap batches lost in the producer's full ring (counted)"] += 1
        else:
            ctx.fail("wrong_answers", f"replay from {start} lacks published batch {i} though it holds {oldest}..")
            return


def learn_wire(ctx: Ctx, w: int, published: list[tuple[int, str]], *seen: list[tuple[int, str]]) -> None:
    """Records, for the recovery judge (``ctx.wire``), the wire seq kvshmd published each batch under, from what
    subscribers and replays got: (wire seq, digest) matched with (engine seq, digest)."""
    eng = {d: s for s, d in published}
    m = ctx.wire.setdefault(w, {})
    for got in seen:
        for s, d in got:
            if d in eng:
                m[s] = eng[d]


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
            got, why = zmq_replay(zc, rep_ep, sub.got[-5][0] if len(sub.got) >= 5 else 0, 10)
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
        last = published[-1][1]
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and not all(sj.has(last) for sj in (sub, slow)):
            time.sleep(0.05)
        for sj in (sub, slow):
            sj.stop.set()
            sj.t.join(5)
        zc_stats = p.call({"op": "stats", "worker": w}) or {}
        zstats = (zc_stats.get("stats") or {}).get("zmq") or zstats
        dropped = int(zstats.get("dropped", 0))
        ring_dropped = int((zc_stats.get("stats") or {}).get("dropped_events") or 0)
        ctx.fig.zmq["ring drops counted (batches lost before kvshmd)"] += ring_dropped
        if VERBOSE:
            print(f"    [zmq] worker {w}: {len(published)} batches published; daemon zmq stats {zstats}", flush=True)
        ctx.fig.zmq["batches published"] += len(published)
        ctx.fig.zmq["drops counted"] += dropped
        k = "healthy SUB: longest wait between two messages (ms, max over runs)"
        ctx.fig.zmq[k] = max(ctx.fig.zmq[k], int(sub.max_gap * 1000))
        if VERBOSE:
            print(f"    [zmq] longest wait between two messages: healthy SUB {sub.max_gap:.2f} s, paused SUB "
                  f"{slow.max_gap:.2f} s", flush=True)
        judge_sub(ctx, zc, rep_ep, sub, "healthy SUB", published, dropped, ring_dropped, cut_ok=False)
        judge_sub(ctx, zc, rep_ep, slow, "paused SUB", published, dropped, ring_dropped, cut_ok=True)
        everything, _ = zmq_replay(zc, rep_ep, 0, 15)
        learn_wire(ctx, w, published, sub.got, slow.got, everything or [])
        zc.term()
        judge(ctx, w, "ZMQ hostile peers")
