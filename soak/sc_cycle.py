"""Scenario ``cycle``: a producer process that publishes on ZMQ and shuts down worker after worker, a new worker id
each time (10,000 in the first run of ``make soak``, 1,000 in later runs, 600 with ``--short``), leaves kvshmd's
descriptors, RSS, per-stream metric series and state directory flat: dead streams are reclaimed
(``daemon/reap.go``). Before, each cycled worker kept its PUB and replay sockets (+2 fds), its index and its series
until an operator sent FORGET (the red team: 120 workers, +240 fds, +20 MiB).

It runs on a kvshmd of its own (its figures are its own, not the other scenarios'), started with
``--max-dead-streams 64`` and continuous checkpoints: the first ``WARM`` workers fill the set of dead streams, then
the daemon is measured (fds, RSS, series carrying a ``worker_id``, checkpoint files), the rest are cycled and it is
measured again. Flat: fds at most ``FD_SLACK`` more, RSS at most ``RSS_SLACK`` more, no more series and files, and
no more than 64 streams. The child is this file run as a script: ``LocalIndexer(w, publish=ZmqPublish(ipc PUB and
replay))``, one batch, ``shutdown()`` (DETACH), for each worker id it is told."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Child, Ctx, Daemon, http_get  # noqa: E402

MAX_DEAD = 64  # the scenario daemon's --max-dead-streams: reached after this many workers
WARM = 2 * MAX_DEAD  # workers cycled before the baseline (the dead set is full and has turned over once)
FD_SLACK = 4  # descriptors the daemon may have open beyond the baseline at the end (connections being closed)
RSS_SLACK = 64 << 20  # bytes of RSS beyond the baseline (the collector's headroom, --gc-headroom); 10,000 kept
# streams held ~1.6 GiB


def _child() -> int:
    """The cycling producer: reads ``{"from": W, "n": N}`` lines, cycles workers W..W+N-1, replies
    ``{"done": N, "secs": S}``; exits at EOF."""
    import kvshm  # the installed wheel

    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.monotonic()
        for w in range(cmd["from"], cmd["from"] + cmd["n"]):
            pub = kvshm.ZmqPublish(endpoint=f"ipc://{a.dir}/pub-{w}.sock", replay_endpoint=f"ipc://{a.dir}/rep-{w}.sock",
                                   buffer_steps=100)
            ix = kvshm.LocalIndexer(w, 4, 1000, socket_path=a.socket, ring_dir=a.dir, ring_bytes=1 << 16, publish=pub)
            ix.apply_batch(0, [kvshm.events.BlockStored([w], None, [w & 0xFFFF] * 4, 4, None, "GPU", None)], ts=1.0)
            ix.shutdown()
        print(json.dumps({"done": cmd["n"], "secs": time.monotonic() - t0}), flush=True)
    return 0



def _sample(d: Daemon, state: str) -> dict[str, int]:
    st, _, body = http_get(d.http, "/metrics")
    lines = body.decode().splitlines()
    series = sum(1 for ln in lines if 'worker_id="' in ln and not ln.startswith("#"))
    streams = next((int(float(ln.split()[1])) for ln in lines if ln.startswith("kvshm_streams ")), -1)
    files = len([f for f in os.listdir(state) if f.endswith(".ckpt")]) if os.path.isdir(state) else 0
    return {"fds": d.fds(), "rss": d.rss(), "series": series if st == 200 else -1, "streams": streams, "ckpts": files}


def sc_cycle(ctx: Ctx) -> None:
    runs = ctx.fig.scenario_runs["cycle"]
    total = 600 if ctx.short else 10_000 if runs <= 1 else 1_000
    work = tempfile.mkdtemp(prefix="cycle-", dir=ctx.work)
    state = os.path.join(work, "state")
    d = Daemon(ctx, os.path.join(work, "kvshmd.sock"), state, "200ms", ["--max-dead-streams", str(MAX_DEAD)])
    child = Child(ctx, "sc_cycle.py", ["--socket", d.sock, "--dir", work])
    try:
        first = 1_000_000 + 100_000 * runs  # worker ids of their own
        if child.call({"from": first, "n": WARM}, timeout=600) is None:
            return
        time.sleep(0.5)  # the last reclaims and connection closes
        base = _sample(d, state)
        r = child.call({"from": first + WARM, "n": total - WARM}, timeout=3600)
        if r is None:
            return
        time.sleep(0.5)
        end = _sample(d, state)
        for _ in range(20):  # connections being closed
            if end["fds"] <= base["fds"] + FD_SLACK:
                break
            time.sleep(0.25)
            end = _sample(d, state)
        ctx.fault(f"cycle: {total} workers published and shut down")
        ctx.fig.details.append(f"[cycle] {total} cycled workers ({total / max(r['secs'] + 1e-9, 1e-9):.0f}/s): "
                               f"after {WARM} {base}, after {total} {end} (rss in bytes)")
        print(f"  cycle: after {WARM} workers {base}; after {total} {end}", flush=True)
        if (end["fds"] > base["fds"] + FD_SLACK or end["rss"] > base["rss"] + RSS_SLACK
                or end["series"] > base["series"] or end["ckpts"] > base["ckpts"] or end["streams"] > MAX_DEAD):
            ctx.fail("leaks", f"kvshmd not flat over {total} cycled workers: after {WARM} {base}, after {total} {end}")
    finally:
        child.finish()
        d.check()
        d.stop()


if __name__ == "__main__":
    sys.exit(_child())
