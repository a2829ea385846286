"""Loopback plumbing: free ports and HTTP requests that never raise for a peer's failure.

:func:`http_get` and :func:`http_post` open one connection per request (as a recovering consumer does) and return a
:class:`Response` whatever happens: status 0 with ``error`` set when nothing answered, the status and body of any
HTTP answer otherwise; ``tries`` repeats a request whose answer is not 2xx (deepinfra's client tries 3 times).
:func:`get_json` is the strict variant for harness plumbing: a 200 parsed as JSON, else :class:`HTTPStatusError`.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


def free_port(n: int = 1, host: str = "127.0.0.1") -> int:
    """A base port with ``n`` consecutive ports free on ``host`` right now (best effort: another process may take
    them before the caller binds)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            base = int(s.getsockname()[1])
        if base + n >= 65535:
            continue
        ok = True
        for i in range(1, n):
            with socket.socket() as s:
                try:
                    s.bind((host, base + i))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"kvshm_testkit: no {n} consecutive free ports on {host}")


@dataclass(frozen=True)
class Response:
    """One HTTP exchange: ``status`` 0 when nothing answered (``error`` says why); header names lower-cased;
    ``seconds`` from connect to the last body byte."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


class HTTPStatusError(Exception):
    """:func:`get_json` got no 200 answer."""

    def __init__(self, url: str, response: Response) -> None:
        what = f"HTTP {response.status}" if response.status else f"no answer ({response.error})"
        super().__init__(f"GET {url}: {what} {response.body[:300]!r}")
        self.url = url
        self.response = response


def request(method: str, url: str, body: bytes | None = None, timeout: float = 10.0,
            headers: dict[str, str] | None = None) -> Response:
    """One request on a new connection to ``url`` (``http://host:port/path?query``)."""
    u = urlsplit(url)
    if u.scheme != "http" or u.hostname is None:
        raise ValueError(f"kvshm_testkit: not an http:// URL: {url!r}")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    t0 = time.perf_counter_ns()
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, data, {k.lower(): v for k, v in r.getheaders()},
                        (time.perf_counter_ns() - t0) / 1e9)
    except (OSError, http.client.HTTPException) as e:
        return Response(0, b"", {}, (time.perf_counter_ns() - t0) / 1e9, repr(e))
    finally:
        conn.close()


def http_get(url: str, timeout: float = 10.0, *, tries: int = 1) -> Response:
    """GET ``url``; an answer that is not 2xx is asked again up to ``tries`` times in all (a short pause between),
    and the last one returned."""
    r = Response(0, error="not asked")
    for attempt in range(max(1, tries)):
        r = request("GET", url, timeout=timeout)
        if r.ok:
            return r
        if attempt + 1 < tries:
            time.sleep(0.05 * (attempt + 1))
    return r


def http_post(url: str, body: bytes, timeout: float = 30.0, content_type: str = "application/json") -> Response:
    """POST ``body`` to ``url`` with ``Content-Type: content_type``."""
    return request("POST", url, body, timeout, {"Content-Type": content_type})


def get_json(url: str, timeout: float = 10.0) -> Any:
    """GET ``url`` and parse its 200 answer as JSON; :class:`HTTPStatusError` for anything else."""
    r = http_get(url, timeout)
    if r.status != 200:
        raise HTTPStatusError(url, r)
    return r.json()
