"""The engine-plugin wire check shared by ``make vllm-plugin-test`` (pybind/vllm_test) and ``make
sglang-plugin-test`` (pybind/sglang_test): kvshm's publisher and the engine's own ``ZmqEventPublisher`` fed the same
batches side by side, every live payload and every replay frame compared byte for byte.

Seqs: kvshmd numbers its wire (docs/lifecycle.md: its own counter, a Cleared batch when an incarnation starts,
empty heartbeats), so the comparison is by payload and order, not by seq value: each test batch must arrive once, in
order, with increasing seqs; a replay from the first one's seq gives the same (seq, payload) pairs; the only other
batches allowed are kvshmd's own (empty heartbeats, Cleared).

An :class:`Engine` says what differs between engines: how to build its test batches and its marker batch (a
Cleared, with a fixed ts), the payload of the marker as the engine encodes it, and its own publisher.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
import zmq

END = [b"", b"", b"\xff" * 8, b""]  # the engines' replay end marker, after the DEALER strips the identity
Frames = list[bytes]
TOPIC = b"kv"


class Publisher(Protocol):
    def publish(self, batch: Any) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class Engine:
    """An engine's side of the check: ``batches()`` new test batch objects each call (publish fills in the dp rank),
    ``cleared(ts)`` a one-Cleared batch, ``marker_payload`` the engine's encoding of ``cleared(MARKER_TS)`` at dp
    rank 0, ``reference(endpoint, replay_endpoint)`` the engine's own publisher (topic ``kv``, dp rank 0)."""

    batches: Callable[[], Sequence[Any]]
    cleared: Callable[[float], Any]
    marker_payload: bytes
    reference: Callable[[str, str], Publisher]


MARKER_TS = 0.75


def apply_batch_side(d: Path, wire: str) -> tuple[Any, Callable[[Any], None], str, str]:
    """kvshm without the plugin: ``LocalIndexer(3, 4, publish=ZmqPublish(..., topic="kv", wire=wire))`` on ipc
    endpoints in ``d``, and a ``publish(batch)`` that hands each batch to ``apply_batch`` under the next seq from 0.
    Returns (indexer, publish, endpoint, replay endpoint); the caller shuts the indexer down."""
    from kvshm import LocalIndexer, ZmqPublish

    endpoint, replay_endpoint = f"ipc://{d}/pub.sock", f"ipc://{d}/replay.sock"
    ix = LocalIndexer(3, 4, publish=ZmqPublish(endpoint=endpoint, replay_endpoint=replay_endpoint, topic="kv",
                                               wire=wire))
    seqs = iter(range(1 << 62))

    def publish(b: Any) -> None:
        ix.apply_batch(next(seqs), b.events, ts=b.ts)

    return ix, publish, endpoint, replay_endpoint


def plugin_env(monkeypatch: pytest.MonkeyPatch, plugins_var: str) -> Path:
    """The plugin tests' environment: a fresh ring directory (returned), block size 4, worker 3, and the engine's
    plugin allow-list (``plugins_var``: VLLM_PLUGINS, SGLANG_PLUGINS) naming only kvshm."""
    d = Path(tempfile.mkdtemp(prefix="kve-"))
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    monkeypatch.setenv("KVSHM_WORKER_ID", "3")
    monkeypatch.setenv("KVSHM_RING_DIR", str(d))
    monkeypatch.setenv(plugins_var, "kvshm")
    return d


def recv(sock: zmq.Socket[bytes]) -> Frames:
    return sock.recv_multipart()


def seq_of(frames: Frames) -> int:
    return int.from_bytes(frames[-2], "big")


def join(eng: Engine, publish: Callable[[Any], object], sub: zmq.Socket[bytes]) -> None:
    """Publishes warm-up batches until the subscriber receives (PUB drops what it sends before the subscription
    arrives), then a marker batch, and reads up to the marker: what comes next is new."""
    sub.setsockopt(zmq.RCVTIMEO, 100)
    for i in range(300):
        publish(eng.cleared(0.5))
        try:
            recv(sub)
            break
        except zmq.Again:
            assert i < 299, "the subscriber never received a batch"
    sub.setsockopt(zmq.RCVTIMEO, 10_000)
    publish(eng.cleared(MARKER_TS))
    while recv(sub)[2] != eng.marker_payload:
        pass


def kvshmd_own(payload: bytes) -> bool:
    """A batch kvshmd publishes on its own (docs/lifecycle.md): an empty heartbeat, or a Cleared."""
    _, events, _ = msgspec.msgpack.decode(payload)
    return bool(events == [] or events == [{"type": "AllBlocksCleared"}])


def live(eng: Engine, publish: Callable[[Any], object], sub: zmq.Socket[bytes],
         want: list[bytes]) -> list[tuple[int, bytes]]:
    """Publishes the test batches and reads the stream until each of ``want`` arrived, in order; returns their
    (seq, payload). Any other batch in between must be kvshmd's own."""
    for b in eng.batches():
        publish(b)
    got: list[tuple[int, bytes]] = []
    while len(got) < len(want):
        frames = recv(sub)
        assert len(frames) == 3 and frames[0] == TOPIC and len(frames[1]) == 8, frames
        if frames[2] == want[len(got)]:
            got.append((seq_of(frames), frames[2]))
        else:
            assert kvshmd_own(frames[2]), ("an unexpected batch", msgspec.msgpack.decode(frames[2]),
                                           "expected", msgspec.msgpack.decode(want[len(got)]))
    seqs = [s for s, _ in got]
    assert seqs == sorted(set(seqs)), f"seqs not increasing: {seqs}"
    return got


def replay(dealer: zmq.Socket[bytes], start: int) -> list[Frames]:
    """Dynamo's gap request: DEALER [b"", start seq]; every frame up to and including the end marker."""
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        frames = recv(dealer)
        out.append(frames)
        if frames == END:
            return out


def sockets(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, replay_endpoint: str) -> tuple[Any, Any]:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 10_000)
    dealer.connect(replay_endpoint)
    return sub, dealer


def engine_reference(eng: Engine, d: Path, ctx: zmq.Context[zmq.Socket[bytes]]) -> tuple[list[bytes], list[Frames]]:
    """The engine's own publisher fed the test batches: the live payloads, and the replay frames from the first
    test batch on."""
    ep, rep = f"ipc://{d}/ref-pub.sock", f"ipc://{d}/ref-replay.sock"
    pub = eng.reference(ep, rep)
    sub, dealer = sockets(ctx, ep, rep)
    try:
        join(eng, pub.publish, sub)
        n = 0
        for b in eng.batches():
            pub.publish(b)
            n += 1
        frames = [recv(sub) for _ in range(n)]
        return [f[2] for f in frames], replay(dealer, seq_of(frames[0]))
    finally:
        pub.shutdown()
        sub.close(0)
        dealer.close(0)


def check_against_reference(eng: Engine, publish: Callable[[Any], object], d: Path, endpoint: str,
                            replay_endpoint: str) -> list[tuple[int, bytes]]:
    """kvshm's stream (``publish`` feeds it; kvshmd on ``endpoint``/``replay_endpoint``) against the engine's own
    publisher: live and replayed, byte for byte. Returns kvshm's (seq, payload) of the test batches."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        want, want_replay = engine_reference(eng, d, ctx)
        assert want_replay[-1] == END and len(want_replay) == len(want) + 1
        sub, dealer = sockets(ctx, endpoint, replay_endpoint)
        try:
            join(eng, publish, sub)
            got = live(eng, publish, sub, want)
            # The replay from the first test batch: the same (seq, payload) pairs in the engine's frames, then its
            # end marker; kvshmd's heartbeats are not kept for replay, and nothing else may come in between.
            frames = replay(dealer, got[0][0])
            assert frames[-1] == END
            body = [f for f in frames[:-1] if not (f[3:] and kvshmd_own(f[3]) and f[3] not in want)]
            assert [(seq_of(f), f[3]) for f in body] == got
            assert all(f[:2] == [b"", TOPIC] and len(f) == 4 for f in body)
            assert [f[3] for f in want_replay[:-1]] == [p for _, p in got], "the engine's replay: the same payloads"
            return got
        finally:
            sub.close(0)
            dealer.close(0)
    finally:
        ctx.term()
