"""kvshm soak: the reliability campaign of issue 10 as a bounded, seeded, repeatable suite.

Run by ``make soak`` (``SOAK_TIME``, default 30m) and ``make soak-short`` (<= 3 min) with the Python of a venv
holding the installed wheel. Everything runs on this machine: kvshmd on a Unix socket in a private temp dir and
HTTP on 127.0.0.1 (port chosen by the kernel), rings in a temp dir, producers are real ``kvshm.LocalIndexer``s
in child processes (``producer.py``). Every process it starts is stopped by its pid; the tmpfs it may mount is
unmounted.

The judge (``judge``): after every fault, a consumer that recovers through ``GET /workers/{w}/kv_recover`` (or
``/kv_recover?worker_id=``), cold (``start=0``) and warm (from the state it rebuilt last time), must end with the
engine's true tree (``model.Truth``: the seeded stream replayed through a model of Dynamo's tree rules) at the
answer's ``last_event_id``, and hold every event the producer acknowledged; or the answer must say
``Kvshm-State: incomplete``. A complete answer with another state is a wrong answer; an answer still behind or
still ``Error`` at the deadline is a wrong answer (silent loss) or a hang.

Figures (printed, and written between the markers of soak/README.md with ``--report``): faults injected, bad
inputs tried, wrong answers, hangs, crashes, leaks, known failures (each naming its defect), worst publish latency.
Exit status 1 when any wrong answer, hang, crash or leak was seen outside the known failures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    Ctx,
    Daemon,
    Producer,
    forget,
    judge,
    publish_some,
    restart_daemon,
)
from sc_faults import (  # noqa: E402
    sc_ckpt_corrupt,
    sc_daemon_kill,
    sc_daemon_stop,
    sc_many_workers,
    sc_producer_kill,
    sc_producer_stop,
    sc_ring_scribble,
    sc_ring_truncate,
    sc_tmpfs_state,
)
from sc_hostile import (  # noqa: E402
    sc_conn_cycles,
    sc_hostile_detach,
    sc_http_hostile,
    sc_socket_hostile,
)
from sc_limits import sc_limits, sc_replay_stuck  # noqa: E402
from sc_plugin import sc_plugin  # noqa: E402
from sc_zmq import (  # noqa: E402
    sc_zmq,
)

SCENARIOS: list[tuple[str, Callable[..., None], bool]] = [  # name, function, takes the base producer
    ("socket_hostile", sc_socket_hostile, False),
    ("conn_cycles", sc_conn_cycles, False),
    ("http_hostile", sc_http_hostile, False),
    ("ring_scribble", sc_ring_scribble, False),
    ("ring_truncate", sc_ring_truncate, False),
    ("daemon_kill", sc_daemon_kill, True),
    ("daemon_stop", sc_daemon_stop, False),
    ("hostile_detach", sc_hostile_detach, False),
    ("ckpt_corrupt", sc_ckpt_corrupt, True),
    ("producer_kill", sc_producer_kill, False),
    ("producer_stop", sc_producer_stop, False),
    ("many_workers", sc_many_workers, False),
    ("tmpfs_state", sc_tmpfs_state, False),
    ("zmq", sc_zmq, False),
    ("limits", sc_limits, False),
    ("replay_stuck", sc_replay_stuck, False),
    ("plugin", sc_plugin, False),
]


# ---------------------------------------------------------------------------------------------------- main
def run(ctx: Ctx, seconds: float) -> None:
    sock_dir = tempfile.mkdtemp(prefix="sock-", dir=ctx.work)
    os.makedirs(os.path.join(ctx.work, "rings"), mode=0o700)
    state_dir = os.path.join(ctx.work, "state")
    ctx.daemon = Daemon(ctx, os.path.join(sock_dir, "kvshmd.sock"), state_dir, "200ms")
    base = Producer(ctx, [1, 2])
    t_end = time.monotonic() + seconds
    cycle = 0
    try:
        publish_some(ctx, base, 100)
        for w in base.workers:
            judge(ctx, w, "start")
        d = ctx.daemon
        d.base_fds, d.base_rss = d.fds(), d.rss()
        while True:
            cycle += 1
            order = list(SCENARIOS)
            if cycle > 1:
                ctx.rng.shuffle(order)
            for name, fn, wants_base in order:
                if time.monotonic() > t_end and cycle > 1:
                    return
                if name == "tmpfs_state" and cycle > 1 and ctx.rng.random() < 0.7:
                    continue  # slow to set up: one in three cycles after the first
                ctx.scenario = name
                ctx.fig.scenario_runs[name] += 1
                t0 = time.monotonic()
                try:
                    fn(ctx, base) if wants_base else fn(ctx)
                except Exception as e:  # a scenario that breaks is a failure of the suite or of kvshm: say which
                    ctx.fail("crashes", f"scenario raised {e!r}: {traceback.format_exc()[-1500:]}")
                assert ctx.daemon is not None
                if not ctx.daemon.alive():
                    restart_daemon(ctx, ctx.daemon)
                # The base producer keeps publishing between faults and is judged after each.
                if not base.check():
                    ctx.lives[1] = ctx.lives.get(1, 0) + 1
                    ctx.lives[2] = ctx.lives.get(2, 0) + 1
                    base = Producer(ctx, [1, 2])
                publish_some(ctx, base, 20)
                for w in base.workers:
                    judge(ctx, w, f"scenario {name}")
                for w in base.workers:
                    if w in ctx.tainted:  # the engine's next Cleared re-bases it: from then on, complete again
                        base.clear(w)
                        base.pub(w, 20)
                        ctx.tainted.discard(w)
                        judge(ctx, w, f"a Cleared after the losses of {name}")
                leak_check(ctx, name)
                print(f"  cycle {cycle} {name}: {time.monotonic() - t0:.1f} s; failures so far "
                      f"{dict(ctx.fig.failures)} known {dict(ctx.fig.known)}", flush=True)
    finally:
        ctx.scenario = "teardown"
        base.quit()
        forget(ctx, base.workers)
        if ctx.daemon is not None:
            leak_check(ctx, "the end", final=True)
            ctx.daemon.stop()


def leak_check(ctx: Ctx, after: str, *, final: bool = False) -> None:
    """The daemon's fds and RSS at a quiet point against its baseline (same attached producers)."""
    d = ctx.daemon
    assert d is not None
    if not d.alive():
        return
    if d.base_fds is None:
        time.sleep(0.3)
        d.base_fds, d.base_rss = d.fds(), d.rss()
        return
    fds = d.fds()
    for _ in range(20):
        if fds <= d.base_fds + 4:
            break
        time.sleep(0.25)  # connections being closed
        fds = d.fds()
    rss = d.rss()
    assert d.base_rss is not None
    if fds > d.base_fds + 4:
        ctx.fail("leaks", f"kvshmd {d.pid} fds {d.base_fds} -> {fds} after {after}")
    if rss > max(2 * d.base_rss, d.base_rss + (96 << 20)):
        ctx.fail("leaks", f"kvshmd {d.pid} RSS {d.base_rss >> 20} MiB -> {rss >> 20} MiB after {after}")
    ctx.fig.details.append(f"[leak check] after {after}: kvshmd {d.pid} fds {d.base_fds} -> {fds}, "
                           f"RSS {d.base_rss >> 20} -> {rss >> 20} MiB") if final else None


def report(ctx: Ctx, seconds: float, elapsed: float, path: str | None) -> int:
    f = ctx.fig
    lines = [
        f"seed {ctx.seed}; ran {elapsed:.0f} s (asked {seconds:.0f} s); kvshmd {ctx.kvshmd}",
        f"faults injected: {sum(f.faults.values())}",
        f"bad inputs tried: {sum(f.bad_inputs.values())}",
        f"recoveries judged: {f.judged} ({f.reported} answers reported incomplete, "
        f"{f.error_answers} Error answers while waiting)",
        f"wrong answers: {f.failures['wrong_answers']}",
        f"hangs: {f.failures['hangs']}",
        f"crashes: {f.failures['crashes']}",
        f"leaks: {f.failures['leaks']}",
        f"losses where none is promised (reported, not silent): {f.failures['losses']}",
        f"known failures (filed defects, not counted above): {sum(f.known.values())} {dict(f.known) or ''}",
        f"worst publish latency: {f.worst_pub_ns / 1e3:.0f} µs (by scenario: "
        + ", ".join(f"{k} {v / 1e3:.0f}" for k, v in sorted(f.worst_pub_by.items())) + ")",
        "answers reported incomplete, by scenario: "
        + (", ".join(f"{k} {v}" for k, v in sorted(f.reported_by.items())) or "none"),
        "ZMQ (healthy SUB and DEALER): " + (", ".join(f"{k} {v}" for k, v in f.zmq.items()) or "not run"),
        "huge config asks to the shared daemon: " + (", ".join(f"{k} {v}" for k, v in f.limits.items()) or "not run"),
        "vLLM plugin: " + (", ".join(f"{k} {v}" for k, v in f.plugin.items()) or "not run"),
        "scenario runs: " + ", ".join(f"{k} {v}" for k, v in sorted(f.scenario_runs.items())),
        "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(f.faults.items())),
        "bad inputs: " + ", ".join(f"{k} {v}" for k, v in sorted(f.bad_inputs.items())),
    ]
    print("\n== kvshm soak figures")
    for ln in lines:
        print(ln)
    if f.details:
        print("\n== details")
        for d in f.details:
            print(d[:3000])
    failed = sum(f.failures.values())
    if path:
        block = ["<!-- soak:begin -->", "```", *lines, "```", ""]
        if f.details:
            block += ["Details:", "", *("- " + d[:1500].replace("\n", " ") for d in f.details), ""]
        block.append("<!-- soak:end -->")
        text = open(path).read() if os.path.exists(path) else "<!-- soak:begin -->\n<!-- soak:end -->\n"
        a, b = text.find("<!-- soak:begin -->"), text.find("<!-- soak:end -->")
        if a < 0 or b < 0:
            text += "\n<!-- soak:begin -->\n<!-- soak:end -->\n"
            a, b = text.find("<!-- soak:begin -->"), text.find("<!-- soak:end -->")
        text = text[:a] + "\n".join(block) + text[b + len("<!-- soak:end -->"):]
        with open(path, "w") as fh:
            fh.write(text)
    verdict = "FAILED" if failed else "passed"
    print(f"\nsoak {verdict}: {failed} failures; seed {ctx.seed} (SOAK_SEED={ctx.seed} replays)")
    return 1 if failed else 0


def parse_duration(s: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(s[:-1]) * units[s[-1]] if s and s[-1] in units else float(s)


def find_kvshmd() -> str:
    import kvshm  # type: ignore[import-not-found,unused-ignore]  # the installed wheel

    p = os.path.join(os.path.dirname(kvshm.__file__), "_bin", "kvshmd")
    if os.access(p, os.X_OK):
        return p
    found = shutil.which("kvshmd")
    if not found:
        raise SystemExit("soak: no kvshmd (install the wheel: make wheel)")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time", default="30m", help="how long to keep cycling through the scenarios (e.g. 90s, 30m)")
    ap.add_argument("--seed", type=int, default=None, help="replay a run (printed at the start)")
    ap.add_argument("--short", action="store_true", help="one pass of every scenario, smaller sizes")
    ap.add_argument("--report", default=None, help="write the figures into this file (between its soak markers)")
    ap.add_argument("--kvshmd", default=None)
    ap.add_argument("--only", default="", help="comma-separated scenario names (debugging)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    seconds = parse_duration(a.time)
    kvshmd = a.kvshmd or find_kvshmd()
    work = tempfile.mkdtemp(prefix="kvshm-soak-")
    os.chmod(work, 0o700)
    print(f"kvshm soak: seed {seed}, {seconds:.0f} s, work dir {work}, kvshmd {kvshmd}", flush=True)
    ctx = Ctx(seed, kvshmd, work, os.environ.get("SOAK_STRICT") == "1", a.short)
    if a.only:
        keep = set(a.only.split(","))
        SCENARIOS[:] = [s for s in SCENARIOS if s[0] in keep]
    t0 = time.monotonic()
    try:
        run(ctx, seconds)
    finally:
        for p in ctx.procs:  # every child, by pid
            if p.poll() is None:
                ctx.fail("leaks", f"process {p.pid} ({p.args!r:.200}) "
                         "still running at the end: killed")
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        rings = os.listdir(os.path.join(work, "rings")) if os.path.isdir(os.path.join(work, "rings")) else []
        rings = [r for r in rings if r not in ctx.dead_rings]
        if rings:
            ctx.fail("leaks", f"ring files left behind by producers that shut down: {rings[:5]}")
    rc = report(ctx, seconds, time.monotonic() - t0, a.report)
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work dir kept for inspection: {work}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
