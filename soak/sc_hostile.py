"""Scenarios: hostile socket and HTTP clients (bad frames, half-open connections, connection cycles, DETACH of
another producer's ring)."""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import time

from harness import (
    FRAME,
    K_ATTACH,
    K_DETACH,
    K_EVENTS,
    K_HEALTH,
    Ctx,
    healthy,
    http_get,
    judge,
    producer,
    read_frame,
    rpc,
)


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
    """A body every strict decoder refuses: not an object, a key in another case, a duplicate key,
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
    """Another same-uid client sends DETACH for a live producer's worker: the producer goes on
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
