"""The protocol client against a scripted server (malformed replies the real daemon never sends) and against the
real kvshmd (errors, reconnect after a restart)."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvshm._client import (
    MAX_REQUEST,
    Client,
    ConnectError,
    ConnectionLost,
    FrameError,
    Kind,
    RemoteError,
    RequestTimeout,
    encode_frame,
)

from helpers import TESTDATA, SharedDaemon

Handler = Callable[[socket.socket, bytes], object]


def read_request(conn: socket.socket) -> bytes:
    """One request frame (header and body) as the scripted server receives it."""
    head = b""
    while len(head) < 4:
        chunk = conn.recv(4 - len(head))
        if not chunk:
            return b""
        head += chunk
    (length,) = struct.unpack("<I", head)
    rest = b""
    while len(rest) < length:
        chunk = conn.recv(length - len(rest))
        if not chunk:
            break
        rest += chunk
    return head + rest


@pytest.fixture
def scripted(short_dir: Path) -> Iterator[Callable[[list[Handler]], str]]:
    """A Unix-socket server that serves one handler per accepted connection, in order."""
    path = str(short_dir / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    srv.settimeout(0.05)
    done = threading.Event()
    threads: list[threading.Thread] = []

    def serve(handlers: list[Handler]) -> str:
        def run() -> None:
            for handler in handlers:
                while True:
                    try:
                        conn, _ = srv.accept()
                        break
                    except TimeoutError:
                        if done.is_set():  # the test did not need every handler
                            return
                conn.settimeout(None)
                with conn:
                    handler(conn, read_request(conn))

        th = threading.Thread(target=run, daemon=True)
        th.start()
        threads.append(th)
        return path

    yield serve
    done.set()
    for th in threads:
        th.join(10)
        assert not th.is_alive()
    srv.close()


def reply(body: bytes, *, kind: int = Kind.HEALTH, status: int = 0, version: int = 1) -> Handler:
    return lambda conn, req: conn.sendall(encode_frame(kind, body, status=status, version=version))


def test_request_frame_layout(scripted: Callable[[list[Handler]], str]) -> None:
    seen: list[bytes] = []

    def handler(conn: socket.socket, req: bytes) -> None:
        seen.append(req)
        conn.sendall(encode_frame(Kind.EVENTS, b'{"Events":{"events":[],"last_event_id":3}}'))

    with Client(scripted([handler])) as c:
        assert c.events(7, 2, None) == b'{"Events":{"events":[],"last_event_id":3}}'
    (req,) = seen
    length, version, kind, status = struct.unpack_from("<IBBH", req)
    assert (length, version, kind, status) == (len(req) - 4, 1, Kind.EVENTS, 0)
    assert json.loads(req[8:]) == {"worker_id": 7, "start": 2, "end": None}


@pytest.mark.parametrize(
    ("handler", "exc", "match"),
    [
        (reply(b"{}", version=2), FrameError, "protocol version 2"),
        (reply(b"{}", kind=Kind.STATS), FrameError, "kind 5"),
        (reply(b"{}", status=7), FrameError, "unknown status 7"),
        (lambda conn, req: conn.sendall(struct.pack("<IBBH", 2, 1, Kind.HEALTH, 0)), FrameError, "length 2"),
        (lambda conn, req: conn.sendall(struct.pack("<IBBH", (1 << 30) + 5, 1, Kind.HEALTH, 0)), FrameError, "length"),
        (reply(b"[1,2]"), FrameError, "not a JSON object"),
        (reply(b"{not json"), FrameError, "not JSON"),
        (lambda conn, req: conn.sendall(encode_frame(Kind.HEALTH, b"{}")[:6]), ConnectionLost, "closed"),
        (lambda conn, req: conn.sendall(encode_frame(Kind.HEALTH, b'{"status":"ok"}')[:-3]), ConnectionLost, "closed"),
        (lambda conn, req: None, ConnectionLost, "closed"),
    ],
)
def test_broken_replies_close_the_connection(
    scripted: Callable[[list[Handler]], str], handler: Handler, exc: type[Exception], match: str
) -> None:
    c = Client(scripted([handler]), timeout=5)
    with pytest.raises(exc, match=match):
        c.health()
    assert not c.connected


def test_error_reply_is_a_remote_error_and_keeps_the_connection(scripted: Callable[[list[Handler]], str]) -> None:
    body = json.dumps({"error": "no stream: nobody attached", "code": "not_found"}).encode()
    c = Client(scripted([reply(body, kind=Kind.DUMP, status=1)]))
    with pytest.raises(RemoteError) as info:
        c.dump(None)
    assert info.value.code == "not_found" and info.value.message == "no stream: nobody attached"
    assert info.value.kind is Kind.DUMP and c.connected
    c.close()


def test_timeout(scripted: Callable[[list[Handler]], str]) -> None:
    release = threading.Event()
    c = Client(scripted([lambda conn, req: release.wait(5)]), timeout=0.2)
    with pytest.raises(RequestTimeout):
        c.health()
    release.set()
    assert not c.connected


def test_idle_connection_closed_by_the_server_is_retried_once(scripted: Callable[[list[Handler]], str]) -> None:
    """The daemon closes idle connections: the next request reconnects transparently."""

    def close_after_first(conn: socket.socket, req: bytes) -> None:
        conn.sendall(encode_frame(Kind.HEALTH, b'{"status":"ok"}'))
        read_request(conn)  # the second request arrives on this connection... and is not answered

    c = Client(scripted([close_after_first, reply(b'{"status":"ok","n":2}')]), timeout=5)
    assert c.health() == {"status": "ok"}
    assert c.health() == {"status": "ok", "n": 2}
    c.close()


def test_attach_is_never_retried(scripted: Callable[[list[Handler]], str]) -> None:
    c = Client(scripted([reply(b'{"status":"ok"}'), lambda conn, req: None]), timeout=5)
    c.health()
    with pytest.raises(ConnectionLost):
        c.attach("/dev/shm/x.ring", 1, 4, 10)


def test_connect_error_and_oversized_request(short_dir: Path) -> None:
    with pytest.raises(ConnectError, match="connect to kvshmd"):
        Client(str(short_dir / "none.sock")).health()
    with pytest.raises(ValueError, match="exceeds"):
        Client(str(short_dir / "none.sock")).match(None, [1] * (MAX_REQUEST // 2))


def test_real_daemon_errors_and_restart(shared_daemon: SharedDaemon) -> None:
    c = Client(shared_daemon.socket_path, timeout=10)
    health = c.health()
    assert health["status"] == "ok" and health["streams"] == 0 and isinstance(health["version"], str)
    with pytest.raises(RemoteError) as info:
        c.events(None, None, None)
    assert info.value.code == "not_found"
    with pytest.raises(RemoteError) as info:
        c.attach("relative.ring", 1, 4, 10)
    assert info.value.code == "bad_request"
    shared_daemon.kill()
    with pytest.raises(ConnectError):
        c.health()  # the dead connection is retried once, and nobody listens
    shared_daemon.start()
    assert c.health()["status"] == "ok"  # same Client, new daemon
    c.close()


def test_error_frame_of_kind_zero(scripted: Callable[[list[Handler]], str]) -> None:
    """Refusals carry kind 0 (the daemon had not read a request): still a RemoteError with its code."""
    busy = json.dumps({"error": "too many connections (1024)", "code": "busy"}).encode()
    c = Client(scripted([reply(busy, kind=0, status=1)]), timeout=5)
    with pytest.raises(RemoteError) as info:
        c.health()
    assert info.value.code == "busy" and "too many connections" in info.value.message
    assert not c.connected


def test_refusal_at_accept_is_reported_when_our_write_fails(short_dir: Path) -> None:
    """A daemon at its connection limit sends one error frame and closes before reading anything; our request
    write then fails (EPIPE): the client reports the daemon's error, not a bare broken pipe."""
    path = str(short_dir / "refuse.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    c = Client(path, timeout=5)
    c.connect()
    conn, _ = srv.accept()
    conn.sendall(encode_frame(0, json.dumps({"error": "peer uid 1000 is not 0", "code": "forbidden"}).encode(),
                              status=1))
    conn.close()
    srv.close()
    with pytest.raises(RemoteError) as info:
        c.attach("/dev/shm/x.ring", 1, 4, 10)
    assert info.value.code == "forbidden" and "peer uid" in info.value.message
    assert not c.connected


# --------------------------------------------------------------------------------------------------------------
# Shared protocol vectors (testdata/protocol/frames.json, checked against the daemon's codec by
# proto/sock/vectors_test.go).

FRAMES = json.loads((TESTDATA / "protocol" / "frames.json").read_text())["frames"]
REQUESTS = [v for v in FRAMES if v["direction"] == "request"]
REPLIES = [v for v in FRAMES if v["direction"] == "reply"]


def test_protocol_vectors_cover_every_python_kind() -> None:
    assert {v["kind"] for v in REQUESTS} >= {int(k) for k in Kind}
    for v in FRAMES:
        if v["kind"] in {int(k) for k in Kind}:
            assert Kind(v["kind"]).name.lower() == v["kind_name"]


@pytest.mark.parametrize("vec", REQUESTS, ids=[v["name"] for v in REQUESTS])
def test_protocol_vector_requests(scripted: Callable[[list[Handler]], str], vec: dict[str, Any]) -> None:
    want = bytes.fromhex(vec["hex"])
    assert encode_frame(vec["kind"], vec["body"].encode()) == want
    length, version, kind, status = struct.unpack_from("<IBBH", want)
    assert (length, version, kind, status) == (vec["length"], vec["version"], vec["kind"], vec["status"])
    if not vec.get("method"):
        return
    # The typed client method, called with the body's fields, sends exactly these bytes.
    seen: list[bytes] = []

    def handler(conn: socket.socket, req: bytes) -> None:
        seen.append(req)
        conn.sendall(encode_frame(req[5], b"{}"))

    with Client(scripted([handler]), timeout=10) as c:
        getattr(c, vec["method"])(**json.loads(vec["body"]))
    assert seen == [want]


@pytest.mark.parametrize("vec", REPLIES, ids=[v["name"] for v in REPLIES])
def test_protocol_vector_replies(scripted: Callable[[list[Handler]], str], vec: dict[str, Any]) -> None:
    frame = bytes.fromhex(vec["hex"])
    kind = Kind(vec["kind"]) if vec["kind"] != 0 else Kind.HEALTH
    c = Client(scripted([lambda conn, req: conn.sendall(frame)]), timeout=10)
    try:
        if vec.get("read_error"):
            with pytest.raises(FrameError, match="protocol version|length"):
                c.call(kind, {})
            assert not c.connected
        elif vec["status"] == 1:
            with pytest.raises(RemoteError) as info:
                c.call(kind, {})
            assert (info.value.code, info.value.message) == (vec["error_code"], vec["error_message"])
            assert c.connected == (vec["kind"] != 0)  # a kind-0 refusal closes the connection
        else:
            assert c.call(kind, {}) == vec["body"].encode()
    finally:
        c.close()
