from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kvshm_testkit import HTTPStatusError, free_port, get_json, http_get, http_post


class _Server:
    """A loopback server answering from a script of statuses (the real http.server, no stand-in client)."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.posted: list[tuple[str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                status = outer.statuses.pop(0) if outer.statuses else 200
                body = json.dumps({"path": self.path}).encode()
                self.send_response(status)
                self.send_header("X-Kvshm-Test", "yes")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers["Content-Length"])
                outer.posted.append((self.headers["Content-Type"], self.rfile.read(n)))
                self.send_response(201)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.srv.shutdown()
    s.srv.server_close()


def test_free_port_gives_bindable_consecutive_ports() -> None:
    base = free_port(4)
    socks = []
    try:
        for i in range(4):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_http_get_returns_status_lowercased_headers_body_and_time(server: _Server) -> None:
    r = http_get(server.url + "/a?b=1")
    assert r.ok and r.status == 200
    assert r.headers["x-kvshm-test"] == "yes"
    assert r.json() == {"path": "/a?b=1"}
    assert r.seconds > 0 and r.error == ""


def test_http_get_answers_status_0_when_nothing_listens() -> None:
    r = http_get(f"http://127.0.0.1:{free_port()}/", 2.0)
    assert r.status == 0 and not r.ok and r.error


def test_http_get_tries_again_on_a_non_2xx_answer(server: _Server) -> None:
    server.statuses = [503, 503]
    assert http_get(server.url + "/x", tries=3).status == 200
    server.statuses = [503, 503]
    assert http_get(server.url + "/x", tries=2).status == 503
    server.statuses = [500]
    assert http_get(server.url + "/x").status == 500


def test_http_post_sends_the_body_with_its_type(server: _Server) -> None:
    r = http_post(server.url + "/register", b'{"a":1}')
    assert (r.status, r.body) == (201, b"ok")
    assert server.posted == [("application/json", b'{"a":1}')]


def test_get_json_raises_for_anything_but_200(server: _Server) -> None:
    assert get_json(server.url + "/j") == {"path": "/j"}
    server.statuses = [404]
    with pytest.raises(HTTPStatusError, match="HTTP 404") as e:
        get_json(server.url + "/j")
    assert e.value.response.status == 404


def test_a_url_that_is_not_http_is_a_programmer_error() -> None:
    with pytest.raises(ValueError, match="not an http"):
        http_get("unix:///tmp/x")
