"""The engine-served ``/kv_recover``: what the vLLM fork does with Dynamo's ``LocalKvIndexer`` in the engine.

:func:`serve_kv_recover` answers ``GET /kv_recover[?start=S][&end=E]`` with ``source.get_events_json(start, end)``
from a :class:`~http.server.ThreadingHTTPServer` on a daemon thread (every other path: 404). The harnesses use it
as the baseline a shared kvshmd is measured and judged against; stop it with ``server.shutdown()``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse


class EventsSource(Protocol):
    """An index that answers Dynamo's recovery query (``LocalKvIndexer``, ``kvshm.LocalIndexer``)."""

    def get_events_json(self, start: int | None, end: int | None, /) -> str: ...


def serve_kv_recover(source: EventsSource, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serve ``/kv_recover`` from ``source`` on ``host:port`` (0: any free port; read ``server.server_address``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            if url.path != "/kv_recover":
                self.send_error(404)
                return
            q = parse_qs(url.query)
            start = int(q["start"][0]) if "start" in q else None
            end = int(q["end"][0]) if "end" in q else None
            body = source.get_events_json(start, end).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name=f"kv_recover {host}:{port}", daemon=True).start()
    return srv
