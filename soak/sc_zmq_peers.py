"""Scenario zmq_peers: hostile peers on kvshmd's ZMQ TCP sockets (tcp://*:PORT, as vLLM binds them), each from a
loopback address of its own (all of 127/8 is loopback on Linux: another "host" each), beside a healthy libzmq
router on 127.0.0.1. The floods are the ones zmqpub's bounds answer (zmqpub/doc.go, "Connections"): idle
connections past one address's share, PINGs never read and PINGs with oversized contexts, subscription floods,
unfinished replay requests. The healthy SUB must get every batch in order with no wait over MAX_WAIT while the
producer publishes, its replay must fill what it asks, each flood must be refused (kvshm_zmq_peers_cut_total), and
kvshmd's RSS must stay under its --max-memory."""

from __future__ import annotations

import re
import socket
import threading
import time
import traceback
from collections.abc import Callable

import zmq  # pyzmq: the healthy router's sockets
from harness import DAEMON_MAX_MEMORY, VERBOSE, Ctx, http_get, judge, producer
from sc_zmq import SubJudge, judge_sub, learn_wire

MAX_WAIT = 1.0  # s: the healthy SUB's longest wait between two batches while the producer publishes

GREETING = b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def frame(body: bytes, flags: int = 0) -> bytes:
    """A ZMTP frame (short or long)."""
    if len(body) > 255:
        return bytes([flags | 0x02]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def command(name: bytes, data: bytes) -> bytes:
    return frame(bytes([len(name)]) + name + data, 0x04)


def ready(socket_type: bytes) -> bytes:
    return command(b"READY", b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type)


def ping(ctx: bytes) -> bytes:
    return command(b"PING", b"\x00\x00" + ctx)


def zmtp_peer(src: str, port: int, socket_type: bytes) -> socket.socket | None:
    """A raw connection from ``src`` that runs the NULL handshake as ``socket_type``; None when kvshmd closed it (a
    bound refused it at accept)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((src, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.sendall(GREETING + ready(socket_type))
        got = b""
        while len(got) < 66 or len(got) < 66 + got[65]:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("closed")
            got += chunk
        s.settimeout(None)
        return s
    except OSError:
        s.close()
        return None


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    """Whether kvshmd closes ``s`` within ``timeout`` (whatever it sends before is read and dropped)."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except OSError:
        return False


class Floods:
    """The hostile peers, each kind in its own thread, each from its own loopback address."""

    def __init__(self, ctx: Ctx, pub: int, rep: int) -> None:
        self.ctx, self.pub, self.rep = ctx, pub, rep
        self.stop = threading.Event()
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self.kinds: list[Callable[[], None]] = [self.idle_conns, self.ping_unread, self.ping_oversized,
                                                self.sub_flood, self.unfinished]
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True) for f in self.kinds]

    def _guard(self, f: Callable[[], None]) -> None:
        try:
            f()
        except Exception as e:  # a broken flood is the suite's bug: say so
            self.errors.append(f"{f.__name__}: {e!r} {traceback.format_exc()[-800:]}")

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def hold(self, s: socket.socket) -> None:
        with self.lock:
            self.held.append(s)

    def idle_conns(self) -> None:
        """127.0.0.2: idle connections that finish the handshake (a topic that never matches), past its share."""
        n = 150 if self.ctx.short else 1100
        for port, st, first in ((self.pub, b"SUB", frame(b"\x01never")), (self.rep, b"DEALER", b"")):
            for _ in range(n):
                if self.stop.is_set():
                    return
                s = zmtp_peer("127.0.0.2", port, st)
                if s is None:
                    self.count("idle connections refused (past the address's share)")
                    continue
                s.sendall(first)
                self.hold(s)
                self.count("idle connections held")

    def ping_unread(self) -> None:
        """127.0.0.3: 4 subscribers sending PINGs (16-byte contexts) without end and never reading a PONG."""
        conns = [s for s in (zmtp_peer("127.0.0.3", self.pub, b"SUB") for _ in range(4)) if s is not None]
        burst = ping(b"\x01" * 16) * 4000
        while not self.stop.is_set() and conns:
            for s in conns:
                try:
                    s.sendall(burst)
                except OSError:
                    conns.remove(s)
                    break
                self.count("PINGs sent unread", 4000)
            time.sleep(0.02)
        for s in conns:
            s.close()

    def ping_oversized(self) -> None:
        """127.0.0.4: PINGs with a 60 KiB context (ZMTP 3.1 allows 16 bytes), each on a new connection."""
        while not self.stop.wait(0.1):
            s = zmtp_peer("127.0.0.4", self.rep, b"DEALER")
            if s is None:
                continue
            try:
                s.sendall(ping(b"\x02" * (60 << 10)))
            except OSError:
                pass
            if not closed_by_peer(s, 10):
                self.ctx.fail("wrong_answers", "a PING with a 60 KiB context was not cut within 10 s")
            s.close()
            self.count("PINGs with a 60 KiB context")

    def sub_flood(self) -> None:
        """127.0.0.5: subscribers sending 2,000 distinct subscriptions each."""
        subs = b"".join(frame(b"\x01flood-%d" % i) for i in range(2000))
        while not self.stop.wait(0.2):
            s = zmtp_peer("127.0.0.5", self.pub, b"SUB")
            if s is None:
                continue
            try:
                s.sendall(subs)
            except OSError:
                pass
            if not closed_by_peer(s, 10):
                self.ctx.fail("wrong_answers", "a subscriber sending 2,000 subscriptions was not cut within 10 s")
            s.close()
            self.count("subscription floods (2,000 each)")

    def unfinished(self) -> None:
        """127.0.0.6: replay clients each holding an unfinished request of 15 frames of 60 KiB."""
        req = frame(b"\x07" * (60 << 10), 0x01) * 15
        for _ in range(50 if self.ctx.short else 200):
            if self.stop.is_set():
                return
            s = zmtp_peer("127.0.0.6", self.rep, b"DEALER")
            if s is None:
                self.count("unfinished requests refused (past the address's share)")
                continue
            s.sendall(req)
            self.hold(s)
            self.count("unfinished 15-frame requests held")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        with self.lock:
            for s in self.held:
                s.close()
            self.held.clear()
        for what, n in self.counts.items():
            self.ctx.bad(f"zmq_peers: {what}", n)
        for e in self.errors:
            self.ctx.fail("crashes", f"hostile ZMQ peer broke (the suite's bug): {e}")


def free_ports() -> int:
    """A port P with P and P+1 free on every interface (the PUB and the replay socket)."""
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("0.0.0.0", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("0.0.0.0", p + 1))
            except OSError:
                continue
            return int(p)
    raise RuntimeError("no two free consecutive ports")


def peers_cut(ctx: Ctx, w: int) -> dict[str, float]:
    """kvshm_zmq_peers_cut_total of worker ``w`` by reason, from /metrics."""
    assert ctx.daemon is not None
    _, _, body = http_get(ctx.daemon.http, "/metrics")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("kvshm_zmq_peers_cut_total{") and f'worker_id="{w}"' in line:
            m = re.search(r'reason="([a-z_]+)"', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def sc_zmq_peers(ctx: Ctx) -> None:
    """The floods beside a healthy router (module doc)."""
    d = ctx.daemon
    assert d is not None
    port = free_ports()
    n_batches = 1500 if ctx.short else 6000
    with producer(ctx, 1, zmq_dir=f"tcp:{port}", buffer_steps=n_batches * 2) as p:
        w = p.workers[0]
        pub_ep, rep_ep = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
        zc = zmq.Context()
        sub = SubJudge(zc, pub_ep)
        floods = Floods(ctx, port, port + 1)
        published: list[tuple[int, str]] = []
        rss_max = 0
        wait_max = 0.0
        try:
            time.sleep(0.3)  # the subscription reaches the daemon (PUB drops what it sends before)
            floods.start()
            ctx.fault("ZMQ floods from other addresses")
            sub.max_gap = 0.0
            for _ in range(n_batches // 100):
                r = p.batch(w, 100, 2000)
                if r is None:
                    return
                published += [(int(s), dg) for s, dg in r["batches"]]
                rss_max = max(rss_max, d.rss())
            wait_max = sub.max_gap
        finally:
            floods.finish()
        cut = peers_cut(ctx, w)
        last = published[-1][1]
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and not sub.has(last):
            time.sleep(0.05)
        sub.stop.set()
        sub.t.join(5)
        st = (p.call({"op": "stats", "worker": w}) or {}).get("stats") or {}
        dropped = int((st.get("zmq") or {}).get("dropped", 0))
        ring_dropped = int(st.get("dropped_events") or 0)
        z = ctx.fig.zmq
        z["zmq_peers: batches published beside the floods"] += len(published)
        k = "zmq_peers: healthy SUB's longest wait while publishing (ms, max over runs)"
        z[k] = max(z[k], int(wait_max * 1000))
        k = "zmq_peers: kvshmd's largest RSS during the floods (MiB, max over runs)"
        z[k] = max(z[k], rss_max >> 20)
        for reason, n in cut.items():
            z[f"zmq_peers: peers cut ({reason})"] += int(n)
        if VERBOSE:
            print(f"    [zmq_peers] wait {wait_max:.3f} s, RSS {rss_max >> 20} MiB, cut {cut}", flush=True)
        if wait_max > MAX_WAIT:
            ctx.fail("hangs", f"the healthy SUB waited {wait_max:.2f} s for a batch beside the floods (at most "
                     f"{MAX_WAIT} s)")
        if rss_max > DAEMON_MAX_MEMORY:
            ctx.fail("leaks", f"kvshmd's RSS reached {rss_max >> 20} MiB beside the floods, over its --max-memory "
                     f"{DAEMON_MAX_MEMORY >> 20} MiB")
        for reason in ("addr_conns", "ping", "subscriptions"):
            if not cut.get(reason):
                ctx.fail("wrong_answers", f"no peer cut for {reason} (kvshm_zmq_peers_cut_total: {cut})")
        judge_sub(ctx, zc, rep_ep, sub, "healthy SUB beside floods", published, dropped, ring_dropped, cut_ok=False)
        learn_wire(ctx, w, published, sub.got)
        zc.term()
        judge(ctx, w, "ZMQ floods")
