"""Client for kvshmd's query protocol over a Unix stream socket.

Every message, in both directions, is one frame: the byte format (frame diagram, request and reply bodies,
error codes) is specified in ``proto/sock/PROTOCOL.md`` of the kvshm repository, and pinned for this client and
the daemon by ``testdata/protocol/frames.json``.

A :class:`Client` owns one connection and is used by one thread at a time (callers serialize it). Every
request has a deadline; a timeout, an EOF, a reset or a malformed reply closes the connection (the byte stream
can no longer be trusted) and raises a :class:`ClientError` subclass. Idempotent requests (everything but
ATTACH) reconnect and retry once when the connection turns out to be dead, so a client survives a daemon
restart without help. These exceptions are internal: :class:`kvshm.LocalIndexer` turns them into the JSON
``Error`` variant or into its statistics, never into an exception for the engine.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "ClientError",
    "ConnectError",
    "ConnectionLost",
    "FrameError",
    "Kind",
    "RemoteError",
    "RequestTimeout",
    "UntrustedServerError",
]

_R = TypeVar("_R")

PROTOCOL_VERSION: Final = 1
STATUS_OK: Final = 0
STATUS_ERROR: Final = 1
MAX_REQUEST: Final = 4 << 20
MAX_RESPONSE: Final = 1 << 30

# Frame header, as drawn in proto/sock/PROTOCOL.md (wire format: never change without bumping the
# version).
_HEADER: Final = struct.Struct("<IBBH")
HEADER_SIZE: Final = _HEADER.size  # 8
_FIXED_AFTER_LENGTH: Final = HEADER_SIZE - 4  # version, kind, status


class Kind(enum.IntEnum):
    """Request kinds (the ``kind`` byte)."""

    ATTACH = 1
    DETACH = 2
    EVENTS = 3
    DUMP = 4
    STATS = 5
    MATCH = 6
    HEALTH = 7


class ClientError(Exception):
    """Base class of every error raised by this module."""


class ConnectError(ClientError):
    """The daemon's socket could not be connected to (no daemon, stale socket file, permission)."""


class UntrustedServerError(ConnectError):
    """The socket is not this user's own: its directory belongs to another user or is writable by others, or the
    process listening on it runs as another user (SO_PEERCRED). Nothing was sent."""


class ConnectionLost(ClientError):
    """The connection broke during a request (EOF, reset); the connection has been closed.

    ``before_reply`` is true when no byte of the reply had arrived: the request may not have been handled.
    """

    def __init__(self, message: str, *, before_reply: bool = False) -> None:
        super().__init__(message)
        self.before_reply = before_reply


class RequestTimeout(ConnectionLost):
    """A request did not complete before its deadline; the connection has been closed."""


class FrameError(ClientError):
    """The daemon sent a reply that breaks the protocol; the connection has been closed."""


class RemoteError(ClientError):
    """The daemon answered with an ERROR reply."""

    def __init__(self, kind: Kind, code: str, message: str) -> None:
        super().__init__(f"kvshmd {kind.name.lower()}: {code}: {message}")
        self.kind = kind
        self.code = code
        self.message = message


def encode_frame(kind: int, body: bytes, *, status: int = 0, version: int = PROTOCOL_VERSION) -> bytes:
    """Return one frame carrying ``body``."""
    return _HEADER.pack(len(body) + _FIXED_AFTER_LENGTH, version, kind, status) + body


class Client:
    """One connection to kvshmd; not thread-safe (one user at a time).

    ``connect_timeout`` bounds connecting, ``timeout`` bounds each request (send and the whole reply).
    """

    def __init__(self, path: str, *, connect_timeout: float = 2.0, timeout: float = 60.0) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._sock: socket.socket | None = None
        # Replies up to this size arrive with one recv_into here (header and body together); larger ones get a
        # buffer of their own. Reused across requests: one user at a time.
        self._rbuf = bytearray(_RECV_CHUNK)
        self._rview = memoryview(self._rbuf)

    # -- connection ---------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether a connection is open (it may still turn out to be dead on the next request)."""
        return self._sock is not None

    def fileno(self) -> int:
        """File descriptor of the open connection (for poll); -1 when closed."""
        return -1 if self._sock is None else self._sock.fileno()

    def connect(self) -> None:
        """Open the connection if it is not open; raises :class:`ConnectError`."""
        if self._sock is not None:
            return
        _check_socket_dir(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.connect_timeout)
            sock.connect(self.path)
            _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except OSError as e:
            sock.close()
            raise ConnectError(f"connect to kvshmd at {self.path}: {e.strerror or e}") from e
        if uid != os.getuid():
            sock.close()
            raise UntrustedServerError(f"kvshmd socket {self.path} is served by uid {uid} (pid {_pid}), not by uid "
                                       f"{os.getuid()}: refusing to talk to it")
        self._sock = sock

    def close(self) -> None:
        """Close the connection (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------------------------
    def call(
        self, kind: Kind, body: Mapping[str, Any] | None = None, *, retry: bool = True, timeout: float | None = None
    ) -> bytes:
        """Send one request and return the body of its OK reply.

        Raises :class:`RemoteError` for an ERROR reply, :class:`ConnectError` when the daemon cannot be reached,
        :class:`ConnectionLost` / :class:`RequestTimeout` / :class:`FrameError` when the exchange breaks. With
        ``retry`` (the default) a request that finds the connection dead before any reply byte arrived is sent
        once more on a fresh connection.
        """
        return self._request(self._exchange, kind, body, retry, timeout)

    def call_text(
        self, kind: Kind, body: Mapping[str, Any] | None = None, *, retry: bool = True, timeout: float | None = None
    ) -> str:
        """Like :meth:`call`, with the reply body decoded as UTF-8 straight from the receive buffer (one copy: a
        multi-megabyte TreeDump is not copied into bytes first). Invalid UTF-8 is a :class:`FrameError`."""
        return self._request(self._exchange_text, kind, body, retry, timeout)

    def _request(
        self,
        exchange: Callable[[Kind, bytes, float | None], _R],
        kind: Kind,
        body: Mapping[str, Any] | None,
        retry: bool,
        timeout: float | None,
    ) -> _R:
        """Frame ``body`` and run ``exchange``, once more on a fresh connection when ``retry`` allows (see call)."""
        payload = json.dumps(dict(body) if body is not None else {}, separators=(",", ":")).encode()
        if len(payload) + _FIXED_AFTER_LENGTH > MAX_REQUEST:
            raise ValueError(f"kvshm: request of {len(payload)} bytes exceeds the {MAX_REQUEST}-byte limit")
        frame = encode_frame(kind, payload)
        reused = self._sock is not None
        try:
            return exchange(kind, frame, timeout)
        except ConnectionLost as e:
            # A reused connection may have died while idle (daemon restarted): not this request's fault.
            if not (retry and reused and e.before_reply and not isinstance(e, RequestTimeout)):
                raise
        return exchange(kind, frame, timeout)

    def _exchange_text(self, kind: Kind, frame: bytes, timeout: float | None) -> str:
        view = self._exchange_view(kind, frame, timeout)
        try:
            return str(view, "utf-8")
        except UnicodeDecodeError as e:
            self.close()
            raise FrameError(f"kvshmd {kind.name.lower()}: reply is not UTF-8: {e}") from e
        finally:
            view.release()

    def call_json(
        self, kind: Kind, body: Mapping[str, Any] | None = None, *, retry: bool = True, timeout: float | None = None
    ) -> dict[str, Any]:
        """Like :meth:`call`, and parse the reply as a JSON object (:class:`FrameError` if it is not one)."""
        raw = self.call(kind, body, retry=retry, timeout=timeout)
        try:
            value = json.loads(raw)
        except ValueError as e:
            self.close()  # a daemon that breaks the protocol once is not trusted with this stream again
            raise FrameError(f"kvshmd {kind.name.lower()}: reply is not JSON: {e}") from e
        if not isinstance(value, dict):
            self.close()
            raise FrameError(f"kvshmd {kind.name.lower()}: reply is not a JSON object")
        return value

    def _exchange(self, kind: Kind, frame: bytes, timeout: float | None) -> bytes:
        view = self._exchange_view(kind, frame, timeout)
        try:
            return bytes(view)
        finally:
            view.release()

    def _exchange_view(self, kind: Kind, frame: bytes, timeout: float | None) -> memoryview:
        """One request and its OK reply's body, as a view into a receive buffer (valid until the next request;
        the caller releases it). A small reply costs one recv_into for header and body together."""
        self.connect()
        sock = self._sock
        assert sock is not None
        name = kind.name.lower()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            try:
                sock.settimeout(_remaining(deadline))
                sock.sendall(frame)
            except TimeoutError as e:
                raise RequestTimeout(f"kvshmd {name}: request not accepted within the deadline") from e
            except OSError as e:  # EPIPE / ECONNRESET: the daemon closed this connection (idle, or refused it)
                refusal = _pending_refusal(sock, kind)
                if refusal is not None:
                    self.close()
                    raise refusal from e
                raise ConnectionLost(f"kvshmd {name}: connection lost: {e.strerror or e}", before_reply=True) from e
            got = _recv_some(sock, self._rview, HEADER_SIZE, deadline, name)
            length, version, rkind, status = _HEADER.unpack_from(self._rbuf)
            if version != PROTOCOL_VERSION:
                raise FrameError(f"kvshmd {name}: reply has protocol version {version}, want {PROTOCOL_VERSION}")
            if length < _FIXED_AFTER_LENGTH or length - _FIXED_AFTER_LENGTH > MAX_RESPONSE:
                raise FrameError(f"kvshmd {name}: reply length {length} out of range")
            total = length + 4
            if got > total:
                raise FrameError(f"kvshmd {name}: {got - total} bytes after the reply")
            if total <= len(self._rbuf):
                if got < total:
                    _recv_exact_into(sock, self._rview[got:total], deadline, name)
                body = self._rview[HEADER_SIZE:total]
            else:  # a large reply: a buffer of its own, the bytes already read copied once
                big = bytearray(total - HEADER_SIZE)
                bview = memoryview(big)
                bview[:got - HEADER_SIZE] = self._rview[HEADER_SIZE:got]
                _recv_exact_into(sock, bview[got - HEADER_SIZE:], deadline, name)
                body = bview
            if status == STATUS_ERROR:
                code, message = _parse_error(bytes(body))
                if rkind == 0:  # a refusal of the connection itself (busy, forbidden): the daemon closes it
                    self.close()
                raise RemoteError(kind, code, message)
            if rkind != kind:
                raise FrameError(f"kvshmd {name}: reply has kind {rkind}")
            if status != STATUS_OK:
                raise FrameError(f"kvshmd {name}: reply has unknown status {status}")
            return body
        except RemoteError:
            raise  # a well-formed error reply: the connection stays usable (the daemon closes it if it must)
        except ClientError:
            self.close()
            raise

    # -- typed requests -----------------------------------------------------------------------------------
    def health(self, *, timeout: float | None = None) -> dict[str, Any]:
        """HEALTH: ``{"status": "ok", "version": str, "streams": int}``."""
        return self.call_json(Kind.HEALTH, {}, timeout=timeout)

    def attach(
        self,
        ring_path: str,
        worker_id: int,
        kv_block_size: int,
        max_buffer_size: int,
        *,
        dp_rank: int | None = None,
        publish: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """ATTACH this connection as the producer of ``ring_path``; never retried (the connection is the lease).
        ``dp_rank`` makes the stream that rank's only (omitted from the body when None: every rank); ``publish``
        (``kvshm.ZmqPublish.to_json()``) asks the daemon to publish the stream on ZMQ (omitted when None)."""
        body: dict[str, Any] = {
            "ring_path": ring_path,
            "worker_id": worker_id,
            "kv_block_size": kv_block_size,
            "max_buffer_size": max_buffer_size,
        }
        if dp_rank is not None:
            body["dp_rank"] = dp_rank
        if publish is not None:
            body["publish"] = publish
        return self.call_json(Kind.ATTACH, body, retry=False)

    def detach(self, worker_id: int, *, dp_rank: int | None = None, timeout: float | None = None) -> None:
        """DETACH: the daemon drains the stream and keeps its index queryable (``dp_rank``: that rank's stream)."""
        body: dict[str, Any] = {"worker_id": worker_id}
        if dp_rank is not None:
            body["dp_rank"] = dp_rank
        self.call(Kind.DETACH, body, timeout=timeout)

    def events(
        self, worker_id: int | None, start: int | None, end: int | None, *, dp_rank: int | None = None
    ) -> bytes:
        """EVENTS: the exact ``WorkerKvQueryResponse`` JSON bytes. ``dp_rank`` selects that rank's stream, or the
        rank's view of a stream publishing for every rank (omitted from the body when None)."""
        return self.call(Kind.EVENTS, _events_body(worker_id, start, end, dp_rank))

    def events_text(
        self, worker_id: int | None, start: int | None, end: int | None, *, dp_rank: int | None = None
    ) -> str:
        """:meth:`events` decoded straight from the receive buffer (what ``get_events_json`` returns)."""
        return self.call_text(Kind.EVENTS, _events_body(worker_id, start, end, dp_rank))

    def dump(self, worker_id: int | None) -> bytes:
        """DUMP: same as EVENTS with start=end=None."""
        return self.call(Kind.DUMP, {"worker_id": worker_id})

    def stats(self, worker_id: int | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        """STATS: ``{"streams": [...]}``."""
        return self.call_json(Kind.STATS, {"worker_id": worker_id}, timeout=timeout)

    def match(
        self, worker_id: int | None, tokens: list[int], lora_name: str | None = None, is_eagle: bool = False
    ) -> dict[str, Any]:
        """MATCH: ``{"scores": [{"worker_id", "dp_rank", "blocks"}]}``."""
        body = {"worker_id": worker_id, "tokens": tokens, "lora_name": lora_name, "is_eagle": is_eagle}
        return self.call_json(Kind.MATCH, body)


_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _check_socket_dir(path: str) -> None:
    """Raises :class:`UntrustedServerError` unless the socket's directory is a directory of this user that group
    and others cannot write (the daemon checks the same before it listens: daemon/socket.go)."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        st = os.lstat(d)
    except OSError as e:
        raise ConnectError(f"connect to kvshmd at {path}: {e.strerror or e}") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UntrustedServerError(
            f"kvshmd socket directory {d} (uid {st.st_uid}, mode {stat.filemode(st.st_mode)}) is not this user's "
            f"private directory: refusing to connect")


_RECV_CHUNK: Final = 64 << 10


def _events_body(worker_id: int | None, start: int | None, end: int | None, dp_rank: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"worker_id": worker_id, "start": start, "end": end}
    if dp_rank is not None:
        body["dp_rank"] = dp_rank
    return body


def _recv_some(sock: socket.socket, view: memoryview, need: int, deadline: float, name: str) -> int:
    """Read into ``view`` until at least ``need`` bytes are there (as many as one recv gives, up to len(view));
    returns the count. The start of a reply: an EOF or reset before any byte means the daemon dropped the
    connection before handling the request (safe to retry)."""
    got = 0
    while got < need:
        try:
            k = sock.recv_into(view[got:])
        except TimeoutError as e:
            raise RequestTimeout(f"kvshmd {name}: no complete reply within the deadline ({got} bytes)") from e
        except OSError as e:
            raise ConnectionLost(f"kvshmd {name}: connection lost: {e.strerror or e}", before_reply=got == 0) from e
        if k == 0:
            raise ConnectionLost(f"kvshmd {name}: daemon closed the connection", before_reply=got == 0)
        got += k
        if got < need:
            sock.settimeout(_remaining(deadline))
    return got


def _recv_exact_into(sock: socket.socket, view: memoryview, deadline: float, name: str) -> None:
    """Fill ``view`` (the rest of a reply) before ``deadline``."""
    got, n = 0, len(view)
    while got < n:
        sock.settimeout(_remaining(deadline))
        try:
            k = sock.recv_into(view[got:])
        except TimeoutError as e:
            raise RequestTimeout(f"kvshmd {name}: no complete reply within the deadline ({got}/{n} bytes)") from e
        except OSError as e:
            raise ConnectionLost(f"kvshmd {name}: connection lost: {e.strerror or e}") from e
        if k == 0:
            raise ConnectionLost(f"kvshmd {name}: daemon closed the connection")
        got += k


def _pending_refusal(sock: socket.socket, kind: Kind) -> RemoteError | None:
    """The error frame a daemon sends when it refuses a connection at accept time (``busy`` beyond its connection
    limit, ``forbidden`` for another uid) and then closes it: still readable after our write failed."""
    try:
        sock.setblocking(False)
        data = sock.recv(HEADER_SIZE + 4096)
    except OSError:
        return None
    if len(data) < HEADER_SIZE:
        return None
    length, version, _, status = _HEADER.unpack_from(data)
    if version != PROTOCOL_VERSION or status != STATUS_ERROR or len(data) < 4 + length:
        return None
    code, message = _parse_error(data[HEADER_SIZE : 4 + length])
    return RemoteError(kind, code, message)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise RequestTimeout("kvshmd: request deadline exceeded")
    return left


def _parse_error(body: bytes) -> tuple[str, str]:
    try:
        value = json.loads(body)
    except ValueError:
        return "internal", body.decode("utf-8", "replace")[:500]
    if not isinstance(value, dict):
        return "internal", str(value)[:500]
    return str(value.get("code", "internal")), str(value.get("error", ""))
