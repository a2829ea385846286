"""A soak producer: one process holding real ``kvshm.LocalIndexer``s (one per worker) on a shared kvshmd.

It publishes each worker's seeded stream (:class:`model.StreamGen`) on command. Commands arrive as JSON lines on
stdin, replies leave as JSON lines on stdout (the driver, ``soak.py``, mirrors every stream):

* ``{"op": "pub", "worker": W, "n": N, "pace_us": P}``: publish the next N events (P µs apart), reply
  ``{"last_seq": S, "max_lat_ns": L, "dropped": D, "attached": bool}``;
* ``{"op": "clear", "worker": W}``: publish a Cleared (re-bases a stream after a fault), same reply;
* ``{"op": "stats", "worker": W}``: the indexer's ``stats()``;
* ``{"op": "batch", "worker": W, "n": N, "pace_us": P}`` (workers started with ``--zmq-dir``, which publish on ZMQ
  with ``publish=kvshm.ZmqPublish(ipc://...)``): publish the next N events as vLLM-shaped batches of 1-6 events
  (``apply_batch``; the batch's seq is the id of its last event, now and then one more CPU-tier BlockStored the
  index must not apply), P µs between batches; the reply adds ``"batches": [[seq, blake2b of the payload vLLM's
  msgspec encoding gives for that batch], ...]`` and ``"zmq"`` (the daemon's counters);
* ``{"op": "quit"}``: ``shutdown()`` every indexer (DETACH), reply, exit 0.

Every publish call is timed: ``max_lat_ns`` is the slowest ``apply_*`` call of the command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model import Event, StreamGen  # noqa: E402

import kvshm  # noqa: E402  (the installed wheel)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--workers", required=True, help="comma-separated worker_id:life pairs")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--ring-bytes", type=int, default=1 << 20)
    ap.add_argument("--ring-dir", default=None)
    ap.add_argument("--zmq-dir", default=None,
                    help="publish on ZMQ: ipc://DIR/pub-W.sock, ipc://DIR/replay-W.sock; tcp:PORT: tcp://*:PORT and "
                    "PORT+1 (the first worker; the next ones 2 ports up each)")
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    a = ap.parse_args()
    vs: Any = None
    if a.zmq_dir:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "vllmwire"))
        import vllm_structs  # type: ignore[import-not-found,unused-ignore]  # the one reference shape of vLLM 0.33.0's wire (msgspec)

        vs = vllm_structs
    gens: dict[int, StreamGen] = {}
    ixs: dict[int, kvshm.LocalIndexer] = {}
    last: dict[int, int] = {}
    for pair in a.workers.split(","):
        w, life = (int(x) for x in pair.split(":"))
        gens[w] = StreamGen(a.seed, w, life, a.block_size)
        pub = None
        if a.zmq_dir and a.zmq_dir.startswith("tcp:"):  # tcp:PORT: the PUB on every interface at PORT, replay PORT+1
            port = int(a.zmq_dir[4:]) + 2 * (w - int(a.workers.split(":")[0]))
            pub = kvshm.ZmqPublish(endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{port + 1}",
                                   buffer_steps=a.buffer_steps)
        elif a.zmq_dir:
            pub = kvshm.ZmqPublish(endpoint=f"ipc://{a.zmq_dir}/pub-{w}.sock",
                                   replay_endpoint=f"ipc://{a.zmq_dir}/replay-{w}.sock", buffer_steps=a.buffer_steps)
        ixs[w] = kvshm.LocalIndexer(w, a.block_size, 10000, socket_path=a.socket, ring_dir=a.ring_dir,
                                    ring_bytes=a.ring_bytes, publish=pub)
        last[w] = -1
    out = sys.stdout

    def reply(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    reply({"ready": True, "pid": os.getpid(), "rings": {str(w): ix.stats()["ring_path"] for w, ix in ixs.items()}})
    perf = time.perf_counter_ns
    brng = random.Random(f"kvshm-soak-batches:{a.seed}")
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
        if op == "batch":
            reply(publish_batches(ix, gen, vs, int(cmd["n"]), cmd.get("pace_us", 0) / 1e6, a.block_size, brng))
            last[w] = gen.seq
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


def publish_batches(ix: kvshm.LocalIndexer, gen: StreamGen, vs: Any, n: int, pace: float, bs: int,
                    rng: random.Random) -> dict[str, Any]:
    """Publish the next ``n`` events of ``gen`` as vLLM-shaped batches (see the module doc)."""
    from kvshm import events as ke

    perf = time.perf_counter_ns
    worst = 0
    out: list[list[Any]] = []
    left = n
    while left:
        k = min(left, rng.randint(1, 6))
        left -= k
        evs: list[Event] = [gen.next() for _ in range(k)]
        ours: list[Any] = []
        theirs: list[Any] = []
        for ev in evs:
            if ev.kind == "stored":
                ours.append(ke.BlockStored(list(ev.hashes), ev.parent, list(ev.tokens), bs, None, "GPU", None))
                theirs.append(vs.BlockStored(list(ev.hashes), ev.parent, list(ev.tokens), bs, None, "GPU", None))
            elif ev.kind == "removed":
                ours.append(ke.BlockRemoved(list(ev.hashes), "GPU"))
                theirs.append(vs.BlockRemoved(list(ev.hashes), "GPU"))
            else:
                ours.append(ke.AllBlocksCleared())
                theirs.append(vs.AllBlocksCleared())
        if rng.random() < 0.1:  # a CPU-tier store: published on ZMQ, never indexed (the device-tree filter)
            h, toks = rng.randrange(1, 1 << 64), [rng.randrange(0, 1 << 17) for _ in range(bs)]
            ours.append(ke.BlockStored([h], None, toks, bs, None, "CPU", None))
            theirs.append(vs.BlockStored([h], None, toks, bs, None, "CPU", None))
        seq, ts = evs[-1].seq, time.time()
        t0 = perf()
        ix.apply_batch(seq, ours, ts=ts)
        dt = perf() - t0
        worst = max(worst, dt)
        out.append([seq, hashlib.blake2b(vs.payload(ts, theirs, 0), digest_size=16).hexdigest()])
        if pace:
            time.sleep(pace)
    st = ix.stats()
    return {"last_seq": gen.seq, "max_lat_ns": worst, "dropped": st["dropped_events"], "attached": st["attached"],
            "batches": out, "zmq": st.get("zmq")}


if __name__ == "__main__":
    sys.exit(main())
