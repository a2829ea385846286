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
                r.step, r.mode.name, f"{r.right}/{n}", "control" if r.same is None else f"{r.same}/{n}",
                ", ".join(f"{k} {v}" for k, v in sorted(r.applied.items()) if v) or "n/a", r.kvshmd,
                f"{r.seconds:.0f} s", "; ".join(r.notes),
            ])
    steps = markdown_table(["step", "publisher / daemon", "decisions right (router overlap = engine's cached)",
                            "same decision as the control", "events the router applied", "kvshmd /kv_recover",
                            "step took", "notes"], rows)
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
    """Each kvshm mode's PUBs carried the engine's batches as the control's did: as many batches with as many events
    (kvshmd keeps the engine's batch boundaries; its own batches are Cleareds and heartbeats). Meaningful when the
    requests went the same way: recorded on the kvshm run."""
    control = next((r for r in runs if not r.mode.judged), None)
    if control is None:
        return
    want = (sum(w.count.engine for w in control.wire.values()), sum(w.count.events for w in control.wire.values()))
    for run in runs:
        if run.mode.judged:
            got = (sum(w.count.engine for w in run.wire.values()), sum(w.count.events for w in run.wire.values()))
            run.checks.append(("the engine's batches kept (as many batches and events as the control's)", got == want,
                               f"{got[0]} batches, {got[1]} events; control {want[0]}, {want[1]}"))


def failures(runs: list[ModeRun]) -> list[str]:
    """The kvshm rows and checks that miss the goals (the control's never fail the run)."""
    out = []
    for run in runs:
        if not run.mode.judged:
            continue
        out += [f"{r.step} / {r.mode.name}" for r in run.rows if not r.ok]
        out += [f"{name} / {run.mode.name}: {detail}" for name, ok, detail in run.checks if not ok]
    return out
