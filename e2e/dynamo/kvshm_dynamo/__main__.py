"""``python -m kvshm_dynamo --out DIR``: creates a loopback-only network namespace, runs every mode's steps in it
(the control first: the kvshm rows are compared with its decisions), prints the tables (also DIR/table.md), removes
the namespace; exits 1 when a kvshm row or check misses the goals. The state-agent modes (state_agent.py) and the
control run again (``REPEAT_MODES``) run only when ``--modes`` names them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from kvshm_e2e.table import MODES, Mode

from kvshm._launcher import find_kvshmd
from kvshm_testkit import finish, kill_live, run_steps

from . import netns
from .model import make_model
from .scenarios import ModeRun, Setup
from .state_agent import AGENT_MODES, AgentRun, render_agent, veth
from .table import batch_checks, failures, render

RUN_TIMEOUT = 3 * 3600.0
# The control's configuration under another name, run right after it and compared with it as a kvshm mode is (not
# judged, never the control itself): how often two runs of the same requests with the same publisher agree, the
# measure of the router's coin against which the kvshm modes' agreement is read.
REPEAT_MODES = (Mode("vLLM zmq (again)", "zmq", "none"),)
# Each mode's index (its ports) is its place here; the run order puts the repeat right after the control.
ALL_MODES = (*MODES, *AGENT_MODES, *REPEAT_MODES)
RUN_ORDER = (MODES[0], *REPEAT_MODES, *MODES[1:], *AGENT_MODES)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="kvshm_dynamo", description=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="logs, truth files and table.md")
    ap.add_argument("--base-port", type=int, default=19500)
    ap.add_argument("--modes", default=",".join(m.name for m in MODES),
                    help="comma-separated subset of: " + ", ".join(m.name for m in RUN_ORDER)
                    + " (the repeated control and the state-agent modes only when named)")
    args = ap.parse_args(argv)
    if netns.inside() is None:
        return netns.run_inside([sys.executable, "-m", "kvshm_dynamo", *argv], RUN_TIMEOUT)
    return run(args)


def run(args: argparse.Namespace) -> int:
    wanted = {w.strip() for w in args.modes.split(",") if w.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    setup = Setup(model=make_model(args.out / "model"), kvshmd_bin=Path(find_kvshmd()), out=args.out.resolve(),
                  base_port=args.base_port)
    runs: list[ModeRun] = []
    control = None
    t0 = time.monotonic()
    with ExitStack() as stack:
        try:
            for mode in RUN_ORDER:
                if mode.name not in wanted:
                    continue
                i = ALL_MODES.index(mode)
                if mode in AGENT_MODES:
                    if not any(isinstance(r, AgentRun) for r in runs):
                        stack.enter_context(veth())  # removed when the runs are done, whatever happens
                    mr: ModeRun = AgentRun(setup, mode, i, control)
                else:
                    mr = ModeRun(setup, mode, i, control)
                runs.append(mr)
                mr.checks.append(("ran every step", *run_steps(mr.run, mr.rows)))
                if not mode.judged and mode not in REPEAT_MODES:
                    control = {r.step: r.decisions for r in mr.rows}
        finally:
            kill_live()
    batch_checks(runs)
    (args.out / "results.json").write_text(json.dumps([run.summary() for run in runs], indent=1) + "\n")
    bad = failures(runs)
    headline = (f"make e2e-dynamo: {sum(len(r.rows) for r in runs)} rows in {time.monotonic() - t0:.0f} s; "
                + (f"{len(bad)} kvshm rows/checks miss the goals" if bad
                   else "every kvshm row is at least as right as the control"))
    table = render(runs)
    agents = [r for r in runs if isinstance(r, AgentRun)]
    if agents:
        table += "\n\n" + render_agent(agents)
    return finish(args.out, table, headline, bad)


if __name__ == "__main__":
    sys.exit(main())
