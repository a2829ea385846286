"""Real libzmq peers (pyzmq) of a zmqpub publisher, run by TestLibzmqPeersBesideHostiles while hostile peers attack it.

Usage: libzmqpeers.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC

The publisher publishes [TOPIC, seq u64 BE, b"batch-<seq>"] every millisecond or so and keeps every batch for replay.
The peers, each a libzmq socket kvshm's ZMTP must serve exactly:
  - a SUB with ZMQ heartbeats (ivl 100 ms, timeout 600 ms: kvshm's PONGs keep it connected) receives 1,000
    consecutive batches: no seq gap (a dropped heartbeat would reconnect it and lose batches);
  - an XSUB subscribes TOPIC twice and cancels once (libzmq's trie counts a repeat: still subscribed), then cancels
    again: nothing arrives after the second cancel;
  - a DEALER with heartbeats, idle for 2 s (three heartbeat timeouts), replays from the SUB's first seq: every seq
    from it, in order, each payload b"batch-<seq>", then vLLM's end marker;
  - a REQ asks the same seq and gets its first reply (REQ strips the empty delimiter).
Prints one JSON object: {"errors": [...], "sub": n, "replayed": n}.
"""

from __future__ import annotations

import json
import sys
import time

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def heartbeat(s: zmq.Socket[bytes]) -> None:
    s.setsockopt(zmq.HEARTBEAT_IVL, 100)
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 600)
    s.setsockopt(zmq.HEARTBEAT_TTL, 1000)


def recv(s: zmq.Socket[bytes], timeout_ms: int = 10_000) -> list[bytes] | None:
    if not s.poll(timeout_ms):
        return None
    return s.recv_multipart()


def main() -> None:
    pub_ep, rep_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    errors: list[str] = []
    out: dict[str, object] = {"errors": errors}

    sub = ctx.socket(zmq.SUB)
    heartbeat(sub)
    sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(pub_ep)
    seqs: list[int] = []
    while len(seqs) < 1000:
        m = recv(sub)
        if m is None:
            errors.append(f"SUB: nothing for 10 s after {len(seqs)} batches")
            break
        seq = int.from_bytes(m[1], "big")
        if len(m) != 3 or m[0] != topic or m[2] != b"batch-%d" % seq:
            errors.append(f"SUB: message {[f[:20] for f in m]}")
            break
        if seqs and seq != seqs[-1] + 1:
            errors.append(f"SUB: seq {seqs[-1]} then {seq} (a gap: the connection dropped?)")
            break
        seqs.append(seq)
    out["sub"] = len(seqs)

    xsub = ctx.socket(zmq.XSUB)
    xsub.connect(pub_ep)
    for sub_msg in (b"\x01" + topic, b"\x01" + topic, b"\x00" + topic):
        xsub.send(sub_msg)
    if recv(xsub) is None:
        errors.append("XSUB: nothing after two subscriptions and one cancel")
    xsub.send(b"\x00" + topic)
    t_end = time.monotonic() + 1.0  # what was in flight before the cancel
    while time.monotonic() < t_end:
        recv(xsub, 50)
    if recv(xsub, 500) is not None:
        errors.append("XSUB: a batch after its last subscription was cancelled")

    dealer = ctx.socket(zmq.DEALER)
    heartbeat(dealer)
    dealer.connect(rep_ep)
    time.sleep(2.0)  # idle past three heartbeat timeouts: only PONGs keep the connection
    start = seqs[0] if seqs else 0
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    want, n = start, 0
    while True:
        m = recv(dealer)
        if m is None:
            errors.append(f"DEALER: reply stopped after {n} batches")
            break
        if len(m) == 4 and m[2] == END_SEQ and m[3] == b"":
            break
        seq = int.from_bytes(m[2], "big")
        if len(m) != 4 or m[0] != b"" or m[1] != topic or seq != want or m[3] != b"batch-%d" % seq:
            errors.append(f"DEALER: reply message {[f[:20] for f in m]}, want seq {want}")
            break
        want, n = want + 1, n + 1
    out["replayed"] = n
    if n < len(seqs):
        errors.append(f"DEALER: {n} batches replayed, fewer than the {len(seqs)} the SUB got")

    req = ctx.socket(zmq.REQ)
    req.connect(rep_ep)
    req.send(start.to_bytes(8, "big"))
    m = recv(req)
    if m is None or len(m) != 3 or m[0] != topic or int.from_bytes(m[1], "big") != start:
        errors.append(f"REQ: reply {m and [f[:20] for f in m]}, want [topic, {start}, payload]")

    print(json.dumps(out), flush=True)
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
