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
    return "\n\n".join([steps, batches, cpu, checks])


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
