"""Scenarios of issue 19: one producer's configuration never takes the shared kvshmd down (``limits``), and replay
clients that never read never deny a healthy replay (``replay_stuck``).

``limits``: while a healthy producer publishes on ZMQ (judged by a healthy SUB and a replay, and by the recovery
judge), children ask the same shared daemon, as a producer would, for ``buffer_steps`` 2^31-1, ``hwm`` 2^31-1, a
4 GiB ring (sparse: it costs the machine nothing), and all three. Each ask must be refused at ATTACH (code
``limit``: the message names the bound) or accepted within bounds: the daemon stays alive and its RSS does not grow
by more than ``RSS_SLACK``; the healthy stream is unharmed.

``replay_stuck``: 8 DEALERs each ask the replay socket for the whole buffer and never read (receive HWM 1, a 4 KiB
kernel buffer); a healthy DEALER's replay must then complete within ``REPLAY_DEADLINE`` with every batch the
buffer holds, in order, byte-identical.

Both judge batches by their payloads (in order, seqs strictly increasing), never by seq == engine seq: kvshmd
numbers the wire (docs/lifecycle.md)."""

from __future__ import annotations

import tempfile
import time
from typing import Any

import zmq
from harness import (
    Child,
    Ctx,
    judge,
    producer,
    restart_daemon,
)
from sc_zmq import SubJudge, learn_wire, zmq_replay

RSS_SLACK = 256 << 20  # bytes an accepted ask may add to kvshmd's RSS
REPLAY_DEADLINE = 10.0  # seconds for a healthy replay of the whole buffer beside the stuck clients
ASKS: list[tuple[str, dict[str, int]]] = [
    ("buffer_steps", {"buffer_steps": (1 << 31) - 1}),
    ("hwm", {"hwm": (1 << 31) - 1}),
    ("ring", {"ring_bytes": 4 << 30}),
    ("all", {"buffer_steps": (1 << 31) - 1, "hwm": (1 << 31) - 1, "ring_bytes": 4 << 30}),
]


def judge_payloads(ctx: Ctx, who: str, got: list[tuple[int, str]], published: list[str], want_at_least: int) -> None:
    """``got`` (seq, digest) holds the last batches of ``published`` in order (other batches, like kvshmd's own
    Cleared and heartbeats, are skipped), at least ``want_at_least`` of them; seqs strictly increase."""
    seqs = [s for s, _ in got]
    if seqs != sorted(set(seqs)):
        ctx.fail("wrong_answers", f"{who}: seqs out of order or repeated: {seqs[:12]}...")
    mine = set(published)
    ours = [d for _, d in got if d in mine]
    if ours != published[len(published) - len(ours):] or len(ours) < want_at_least:
        ctx.fail("wrong_answers", f"{who}: {len(ours)} of the {len(published)} published batches, not the last "
                 f">= {want_at_least} in order")


def sc_limits(ctx: Ctx) -> None:
    d = ctx.daemon
    assert d is not None
    zdir = tempfile.mkdtemp(prefix="lim-", dir=ctx.work)
    with producer(ctx, 1, zmq_dir=zdir, buffer_steps=5000) as p:
        w = p.workers[0]
        pub_ep, rep_ep = f"ipc://{zdir}/pub-{w}.sock", f"ipc://{zdir}/replay-{w}.sock"
        zc = zmq.Context()
        sub = SubJudge(zc, pub_ep)
        published: list[str] = []
        batches: list[tuple[int, str]] = []
        try:
            time.sleep(0.3)  # the subscription reaches the daemon
            r = p.batch(w, 300, 500)
            if r is None:
                return
            published += [dg for _, dg in r["batches"]]
            batches += [(int(s), dg) for s, dg in r["batches"]]
            for name, ask in ASKS:
                ctx.scenario = f"limits:{name}"
                ctx.bad(f"limits: {name} ask")
                d = ctx.daemon
                assert d is not None
                rss0 = d.rss() if d.alive() else 0
                asker = Child(ctx, "asker.py", [
                    "--socket", d.sock, "--worker", str(ctx.new_worker()), "--zmq-dir", zdir,
                    *[x for k, v in ask.items() for x in (f"--{k.replace('_', '-')}", str(v))]])
                res = asker.get(60)
                time.sleep(0.2)
                if not d.check():  # died (counted as a crash, with its log, by check)
                    restart_daemon(ctx, d)
                    ctx.fig.limits[f"{name}: the shared daemon died"] += 1
                elif res is not None and not res.get("ok"):
                    err = str(res.get("error") or "")
                    ctx.fig.limits[f"{name}: refused" + (" (limit)" if "limit" in err else f" ({err[:80]})")] += 1
                elif res is not None:
                    grew = d.rss() - rss0
                    ctx.fig.limits[f"{name}: accepted, RSS +{max(0, grew) >> 20} MiB"] += 1
                    if grew > RSS_SLACK:
                        ctx.fail("leaks", f"kvshmd RSS grew {grew >> 20} MiB for one producer's {ask}")
                asker.finish()
                r = p.batch(w, 60, 500)  # the healthy stream goes on
                if r is None:
                    return
                published += [dg for _, dg in r["batches"]]
                batches += [(int(s), dg) for s, dg in r["batches"]]
            ctx.scenario = "limits"
            r = p.batch(w, 100, 500)
            if r is None:
                return
            published += [dg for _, dg in r["batches"]]
            batches += [(int(s), dg) for s, dg in r["batches"]]
            t_end = time.monotonic() + 10
            while time.monotonic() < t_end and published[-1] not in {dg for _, dg in sub.got}:
                time.sleep(0.05)
        finally:
            sub.stop.set()
            sub.t.join(5)
        judge_payloads(ctx, "healthy SUB beside huge config asks", sub.got, published, len(published) - 20)
        got, why = zmq_replay(zc, rep_ep, 0, 10)
        if got is None:
            ctx.fail("hangs", f"healthy replay beside huge config asks: {why}")
        else:
            judge_payloads(ctx, "healthy replay beside huge config asks", got, published, len(published))
        learn_wire(ctx, w, batches, sub.got, got or [])
        zc.term()
        judge(ctx, w, "huge config asks beside it")


def sc_replay_stuck(ctx: Ctx) -> None:
    zdir = tempfile.mkdtemp(prefix="rep-", dir=ctx.work)
    n_events = 3000 if ctx.short else 8000
    with producer(ctx, 1, zmq_dir=zdir, buffer_steps=5000) as p:
        w = p.workers[0]
        rep_ep = f"ipc://{zdir}/replay-{w}.sock"
        r = p.batch(w, n_events, 0)
        if r is None:
            return
        published = [dg for _, dg in r["batches"]]
        batches = [(int(s), dg) for s, dg in r["batches"]]
        zc = zmq.Context()
        stuck: list[Any] = []
        try:
            for _ in range(8):
                s = zc.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.RCVHWM, 1)
                s.setsockopt(zmq.RCVBUF, 4096)
                s.connect(rep_ep)
                s.send_multipart([b"", (0).to_bytes(8, "big")])
                stuck.append(s)
            ctx.fault("replay clients that never read")
            ctx.bad("replay: whole-buffer requests never read", len(stuck))
            time.sleep(0.5)  # their replies fill their queues
            t0 = time.monotonic()
            got, why = zmq_replay(zc, rep_ep, 0, REPLAY_DEADLINE)
            took = time.monotonic() - t0
            k = "healthy replay beside 8 stuck replay clients (ms, max over runs)"
            ctx.fig.zmq[k] = max(ctx.fig.zmq[k], int(took * 1000))
            if got is None:
                ctx.fail("hangs", f"a healthy replay beside 8 replay clients that never read: {why}")
            elif took > REPLAY_DEADLINE:
                ctx.fail("hangs", f"a healthy replay beside 8 replay clients that never read took {took:.1f} s")
            else:
                judge_payloads(ctx, "healthy replay beside 8 stuck replay clients", got, published,
                               min(len(published), 5000))
                learn_wire(ctx, w, batches, got)
        finally:
            for s in stuck:
                s.close(0)
            zc.term()
        judge(ctx, w, "8 stuck replay clients")

