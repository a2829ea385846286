"""Scenario plugin: kvshm's vLLM plugin (``KvshmEventPublisher``) in a child process on the shared
kvshmd, fed good vLLM-shaped batches with bad ones mixed in (``plugin_child.py``: not events, an older vLLM's event
lacking fields, not batches, bad timestamps, another dp rank, bad token ids, hashes out of range). Judged: no
exception ever reaches the caller (vLLM's scheduler), every bad batch is counted (``errors``), a healthy replay
holds every good batch in order, byte-identical to vLLM's msgspec encoding (payloads, not seqs: kvshmd numbers the
wire), the daemon stays healthy, and ``publish`` after ``shutdown`` raises ``RuntimeError`` as vLLM's does."""

from __future__ import annotations

import os
import tempfile

import zmq
from harness import Child, Ctx, forget, healthy
from sc_limits import judge_payloads
from sc_zmq import zmq_replay


def sc_plugin(ctx: Ctx) -> None:
    d = ctx.daemon
    assert d is not None
    zdir = tempfile.mkdtemp(prefix="plg-", dir=ctx.work)
    w = ctx.new_worker()
    env = dict(os.environ, KVSHM_SOCKET=d.sock, KVSHM_KV_BLOCK_SIZE="4", KVSHM_WORKER_ID=str(w),
               KVSHM_RING_DIR=os.path.join(ctx.work, "rings"))
    child = Child(ctx, "plugin_child.py", ["--zmq-dir", zdir, "--seed", str(ctx.rng.randrange(1 << 30))], env)
    try:
        if child.get(60) is None:
            return
        r = child.call({"op": "run", "n": 400 if ctx.short else 1500}, timeout=120)
        if r is None:
            return
        good = [dg for _, dg in r["good"]]
        n_bad = sum(r["bad"].values())
        for kind, n in r["bad"].items():
            ctx.bad(f"plugin: {kind}", n)
        ctx.fig.plugin["good batches"] += len(good)
        ctx.fig.plugin["bad batches (all contained)" if not r["escaped"] else "bad batches"] += n_bad
        if r["escaped"]:
            ctx.fail("crashes", f"{len(r['escaped'])} exceptions reached vLLM's scheduler from publish(): "
                     f"{r['escaped'][:3]}")
        if r["errors"] != n_bad:
            ctx.fail("wrong_answers", f"the plugin counted {r['errors']} dropped batches for {n_bad} bad ones")
        zc = zmq.Context()
        got, why = zmq_replay(zc, f"ipc://{zdir}/rep.sock", 0, 15)
        zc.term()
        if got is None:
            ctx.fail("hangs", f"replay of the plugin's stream: {why}")
        else:
            judge_payloads(ctx, "replay of the plugin's stream", got, good, len(good))
        healthy(ctx, "the plugin's bad batches")
        r = child.call({"op": "shutdown"}, timeout=60)
        if r is not None and not str(r.get("after_shutdown", "")).startswith("RuntimeError"):
            ctx.fail("wrong_answers", f"publish after shutdown: {r.get('after_shutdown')} (vLLM raises RuntimeError)")
    finally:
        child.finish()
        forget(ctx, [w])  # a shared daemon keeps an ended stream's endpoints bound (its end Cleared) until FORGET
