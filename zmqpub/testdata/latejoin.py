"""A libzmq SUB that connects before the PUB is bound, as dynamo.vllm's relay does across a kvshmd restart; run by
TestLibzmqSubReconnectingAfterBind.

Usage: latejoin.py PUB_ENDPOINT N

Connects (libzmq retries every 100 ms until the endpoint is bound), prints "connecting" once connect() returned,
then receives N messages and prints one JSON object: {"seqs": [...], "errors": [...]}.
"""

from __future__ import annotations

import json
import sys

import zmq


def main() -> None:
    ep, n = sys.argv[1], int(sys.argv[2])
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep)
    print("connecting", flush=True)
    seqs: list[int] = []
    errors: list[str] = []
    while len(seqs) < n:
        if not sub.poll(10_000):
            errors.append(f"nothing for 10 s after {len(seqs)} messages")
            break
        m = sub.recv_multipart()
        if len(m) != 3 or len(m[1]) != 8:
            errors.append(f"message {[f[:20] for f in m]}")
            break
        seqs.append(int.from_bytes(m[1], "big"))
    print(json.dumps({"seqs": seqs, "errors": errors}), flush=True)
    sub.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
