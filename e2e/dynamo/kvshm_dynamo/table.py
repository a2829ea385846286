"""The printed tables: one row per step and mode, the batches each worker's PUB carried, the checks."""

from __future__ import annotations

from kvshm_testkit import markdown_table

from .scenarios import ModeRun


def render(runs: list[ModeRun]) -> str:
    rows = []
    for run in runs:
        for r in run.rows:
            n = len(r.decisions)
            rows.append([
                r.step, r.mode.name, f"{r.right}/{n - r.failed}", str(r.failed),
                ("n/a" if r.mode.judged else "control") if r.same is None else f"{r.same}/{n}",
                f"{r.ties}/{n}", r.first_divergence() or "control",
                ", ".join(f"{k} {v}" for k, v in sorted(r.applied.items()) if v) or "n/a", r.kvshmd,
                f"{r.seconds:.0f} s", "; ".join(r.notes),
            ])
    steps = markdown_table(["step", "publisher / daemon", "decisions right (router's overlap = engine's cached)",
                            "requests failed (routed to a dead worker)", "same decision as the control",
                            "ties (both workers the same overlap)", "first divergence from the control",
                            "events the router applied", "kvshmd /kv_recover", "step took", "notes"], rows)
    batches = markdown_table(
        ["worker", "publisher / daemon", "engine batches", "events in them", "kvshmd's Cleared batches",
         "kvshmd's heartbeats", "all batches"],
        [[str(i), run.mode.name, str(rec.count.engine), str(rec.count.events), str(rec.count.cleared),
          str(rec.count.empty), str(rec.count.total)] for run in runs for i, rec in sorted(run.wire.items())])
    def per_request(run: ModeRun, seconds: float) -> str:
        return f"{1000 * seconds / max(1, len(run.rows[0].decisions)):.1f} ms" if run.rows else "-"

    cpu = markdown_table(
        ["publisher / daemon", "engine-core CPU per request (steady step, both workers)", "kvshmd CPU per request"],
        [[run.mode.name, per_request(run, run.engine_cpu),
          per_request(run, run.kvshmd_cpu) if run.mode.daemon != "none" else "n/a"] for run in runs])
    checks = markdown_table(["check", "publisher / daemon", "result"],
                            [[name, run.mode.name, f"{'ok' if ok else 'FAIL'}: {detail}"]
                             for run in runs for name, ok, detail in run.checks])
    return "\n\n".join([steps, batches, cpu, ties(runs), checks])


def ties(runs: list[ModeRun]) -> str:
    """Whether the tie column can be trusted and what the router did off the ties, per mode: each worker's overlap
    read from its PUB's events against the router's own for the worker it chose (a worker down is not compared:
    the router keeps a dead worker's blocks until discovery drops it), and the decisions between workers of
    different overlaps that went to the larger one (the router's cost with one request at a time). Reported, not
    judged."""
    out = []
    for run in runs:
        ds = [d for r in run.rows for d in r.decisions if d.worker and len(d.overlaps) == 2]
        seen = [d for d in ds if d.overlaps[d.worker - 1] >= 0]
        apart = [d for d in ds if min(d.overlaps) >= 0 and d.overlaps[0] != d.overlaps[1]]
        same = [r.same_overlap for r in run.rows if r.same_overlap is not None]
        n = sum(len(r.decisions) for r in run.rows if r.same_overlap is not None)
        out.append([run.mode.name, f"{sum(d.overlaps[d.worker - 1] == d.overlap for d in seen)}/{len(seen)}",
                     f"{sum(d.tie for d in ds)}/{len(ds)}",
                     f"{sum(d.overlap == max(d.overlaps) for d in apart)}/{len(apart)}",
                     f"{sum(same)}/{n}" if same else "control"])
    return markdown_table(["publisher / daemon", "overlap from the events = the router's (chosen worker, up)",
                           "ties", "not a tie: to the larger overlap", "same overlap as the control (any worker)"],
                          out)


def batch_checks(runs: list[ModeRun]) -> None:
    """Each PUB carried one engine batch per served request: every request's prefill stores new blocks in one
    engine step (its evictions in the same step), and vLLM publishes one batch per step with events. The control
    shows the rule holds for vLLM's own publisher; a kvshm mode that split or merged the engine's batches fails it.
    A request that failed while the frontend was being killed may have run on an engine: those are allowed. (The
    decisions differ between modes, the router breaking ties at random, so counts are not compared across them.)"""
    for run in runs:
        got = sum(w.count.engine for w in run.wire.values())
        run.checks.append(("one engine batch per served request (the engine's batch boundaries kept)",
                           run.served <= got <= run.served + run.unknown,
                           f"{got} engine batches, {run.served} requests served"
                           + (f" (+ up to {run.unknown} cut by the frontend's kill)" if run.unknown else "")))


def failures(runs: list[ModeRun]) -> list[str]:
    """The kvshm rows and checks that miss the goals (the control's never fail the run)."""
    out = []
    for run in runs:
        if not run.mode.judged:
            continue
        out += [f"{r.step} / {r.mode.name}" for r in run.rows if not r.ok]
        out += [f"{name} / {run.mode.name}: {detail}" for name, ok, detail in run.checks if not ok]
    return out
