"""A libzmq (pyzmq) peer of kvshmd's ZMQ publisher, driven by the daemon's Go tests.

Modes (one JSON object per line on stdout, flushed):
  sub ENDPOINT            SUB subscribed to everything: prints {"ready": true} once connected, then
                          {"topic": hex, "seq": int, "payload": hex, "frames": n} per message, until stdin closes.
  replay ENDPOINT START   DEALER: sends ["", START as u64 BE], prints {"frames": [hex...]} per reply message up to
                          and including the end marker (seq frame 0xFF*8, empty payload), then exits.
  stuck ENDPOINT          SUB subscribed to everything with RCVHWM 1 that never reads: prints {"ready": true} and
                          waits for stdin to close.
"""

from __future__ import annotations

import json
import sys
import threading

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def stdin_closed(ev: threading.Event) -> None:
    sys.stdin.read()
    ev.set()


def main() -> None:
    mode, endpoint = sys.argv[1], sys.argv[2]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    done = threading.Event()
    threading.Thread(target=stdin_closed, args=(done,), daemon=True).start()
    if mode == "sub":
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(endpoint)
        emit({"ready": True})
        while not done.is_set():
            if s.poll(50):
                frames = s.recv_multipart()
                emit({"topic": frames[0].hex(), "seq": int.from_bytes(frames[1], "big") if len(frames) > 1 else -1,
                      "payload": frames[-1].hex(), "frames": len(frames)})
    elif mode == "replay":
        d = ctx.socket(zmq.DEALER)
        d.connect(endpoint)
        d.send_multipart([b"", int(sys.argv[3]).to_bytes(8, "big")])
        while True:
            frames = d.recv_multipart()
            emit({"frames": [f.hex() for f in frames]})
            if len(frames) >= 3 and frames[-2] == END_SEQ and frames[-1] == b"":
                break
    elif mode == "stuck":
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(endpoint)
        emit({"ready": True})
        done.wait()
    else:
        raise SystemExit(f"unknown mode {mode}")
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
