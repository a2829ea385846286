"""Scenario zmq_peers: hostile peers on kvshmd's ZMQ TCP sockets (tcp://*:PORT, as vLLM binds them), each from a
loopback address of its own (all of 127/8 is loopback on Linux: another "host" each), beside a healthy libzmq
router on 127.0.0.1. The floods are the ones zmqpub's bounds answer (zmqpub/doc.go, "Bounds"): idle
connections past one address's share, PINGs never read and PINGs with oversized contexts, subscription floods,
unfinished replay requests. The healthy SUB must get every batch in order with no wait over MAX_WAIT while the
producer publishes, its replay must fill what it asks, each flood must be refused (kvshm_zmq_peers_cut_total), and
kvshmd's RSS must stay under its --max-memory."""

from __future__ import annotations

import re
import socket
import time

import zmq  # pyzmq: the healthy router's sockets
from harness import DAEMON_MAX_MEMORY, VERBOSE, Ctx, http_get, judge, producer
from sc_zmq import Hostiles, SubJudge, judge_sub, learn_wire

from kvshm_testkit import free_port

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


class Floods(Hostiles):
    """The hostile peers, each kind in its own thread, each from its own loopback address."""

    def __init__(self, ctx: Ctx, pub: int, rep: int) -> None:
        super().__init__(ctx, [self.idle_conns, self.ping_unread, self.ping_oversized, self.sub_flood, self.unfinished],
                         "zmq_peers: ")
        self.pub, self.rep = pub, rep
        self.held: list[socket.socket] = []

    def hold_many(self, n: int, src: str, port: int, st: bytes, data: bytes, what: str) -> None:
        """``n`` connections from ``src`` that finish the handshake, send ``data`` and stay open until ``finish``; those
        kvshmd refuses at accept are counted as such."""
        for _ in range(n):
            if self.stop.is_set():
                return
            s = zmtp_peer(src, port, st)
            if s is None:
                self.count(f"{what} refused (past the address's share)")
                continue
            s.sendall(data)
            with self.lock:
                self.held.append(s)
            self.count(f"{what} held")

    def idle_conns(self) -> None:
        """127.0.0.2: idle connections that finish the handshake (a topic that never matches), past its share."""
        n = 150 if self.ctx.short else 1100
        self.hold_many(n, "127.0.0.2", self.pub, b"SUB", frame(b"\x01never"), "idle connections")
        self.hold_many(n, "127.0.0.2", self.rep, b"DEALER", b"", "idle connections")

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

    def cut_each(self, src: str, port: int, st: bytes, data: bytes, every: float, what: str) -> None:
        """From ``src``, a new connection every ``every`` s sends ``data``, which kvshmd must cut within 10 s."""
        while not self.stop.wait(every):
            s = zmtp_peer(src, port, st)
            if s is None:
                continue
            try:
                s.sendall(data)
            except OSError:
                pass
            if not closed_by_peer(s, 10):
                self.ctx.fail("wrong_answers", f"{what}: not cut within 10 s")
            s.close()
            self.count(what)

    def ping_oversized(self) -> None:
        """127.0.0.4: PINGs with a 60 KiB context (ZMTP 3.1 allows 16 bytes), each on a new connection."""
        self.cut_each("127.0.0.4", self.rep, b"DEALER", ping(b"\x02" * (60 << 10)), 0.1,
                      "PINGs with a 60 KiB context")

    def sub_flood(self) -> None:
        """127.0.0.5: subscribers sending 2,000 distinct subscriptions each."""
        subs = b"".join(frame(b"\x01flood-%d" % i) for i in range(2000))
        self.cut_each("127.0.0.5", self.pub, b"SUB", subs, 0.2, "subscription floods (2,000 each)")

    def unfinished(self) -> None:
        """127.0.0.6: replay clients each holding an unfinished request of 15 frames of 60 KiB."""
        self.hold_many(50 if self.ctx.short else 200, "127.0.0.6", self.rep, b"DEALER",
                       frame(b"\x07" * (60 << 10), 0x01) * 15, "unfinished 15-frame requests")

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        with self.lock:
            for s in self.held:
                s.close()
            self.held.clear()
        super().finish()


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
    port = free_port(2, host="0.0.0.0")  # the PUB and the replay socket, on every interface
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
