"""A soak producer: one process holding real ``kvshm.LocalIndexer``s (one per worker) on a shared kvshmd.

It publishes each worker's seeded stream (:class:`model.StreamGen`) on command. Commands arrive as JSON lines on
stdin, replies leave as JSON lines on stdout (the driver, ``soak.py``, mirrors every stream):

* ``{"op": "pub", "worker": W, "n": N, "pace_us": P}``: publish the next N events (P µs apart), reply
  ``{"last_seq": S, "max_lat_ns": L, "dropped": D, "attached": bool}``;
* ``{"op": "clear", "worker": W}``: publish a Cleared (re-bases a stream after a fault), same reply;
* ``{"op": "stats", "worker": W}``: the indexer's ``stats()``;
* ``{"op": "quit"}``: ``shutdown()`` every indexer (DETACH), reply, exit 0.

Every publish call is timed: ``max_lat_ns`` is the slowest ``apply_*`` call of the command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model import StreamGen  # noqa: E402

import kvshm  # noqa: E402  (the installed wheel)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--workers", required=True, help="comma-separated worker_id:life pairs")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--ring-bytes", type=int, default=1 << 20)
    ap.add_argument("--ring-dir", default=None)
    a = ap.parse_args()
    gens: dict[int, StreamGen] = {}
    ixs: dict[int, kvshm.LocalIndexer] = {}
    last: dict[int, int] = {}
    for pair in a.workers.split(","):
        w, life = (int(x) for x in pair.split(":"))
        gens[w] = StreamGen(a.seed, w, life, a.block_size)
        ixs[w] = kvshm.LocalIndexer(w, a.block_size, 10000, socket_path=a.socket, ring_dir=a.ring_dir,
                                    ring_bytes=a.ring_bytes)
        last[w] = -1
    out = sys.stdout

    def reply(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": True, "pid": os.getpid(), "rings": {str(w): ix.stats()["ring_path"] for w, ix in ixs.items()}})
    perf = time.perf_counter_ns
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            for ix in ixs.values():
                ix.shutdown()
            reply({"bye": True})
            return 0
        w = int(cmd["worker"])
        ix, gen = ixs[w], gens[w]
        if op == "stats":
            reply({"stats": ix.stats()})
            continue
        n = 1 if op == "clear" else int(cmd["n"])
        pace = cmd.get("pace_us", 0) / 1e6
        worst = 0
        for _ in range(n):
            ev = gen.next(kind="cleared" if op == "clear" else None)
            t0 = perf()
            if ev.kind == "stored":
                ix.apply_stored(ev.seq, ev.tokens, ev.hashes, ev.parent)
            elif ev.kind == "removed":
                ix.apply_removed(ev.seq, ev.hashes)
            else:
                ix.apply_cleared(ev.seq)
            dt = perf() - t0
            if dt > worst:
                worst = dt
            last[w] = ev.seq
            if pace:
                time.sleep(pace)
        st = ix.stats()
        reply({"last_seq": last[w], "max_lat_ns": worst, "dropped": st["dropped_events"], "attached": st["attached"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
