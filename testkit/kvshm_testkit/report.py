"""How an engine harness ends: each mode's steps run under one guard, then one table, one verdict, one exit code."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence, Sized
from pathlib import Path


def run_steps(run: Callable[[], object], steps: Sized) -> tuple[bool, str]:
    """Runs a mode's steps and says whether all of them ran: ``(True, "N steps")``, or ``(False, "<Error>: why")``
    when one raised (a bounded wait ran out, a process died: the mode's remaining steps are lost, the harness goes
    on with the next mode). ``steps`` is the list ``run`` appends its rows to; it is counted after the run. The
    traceback goes to stderr, the harness's log."""
    try:
        run()
    except Exception as e:
        traceback.print_exc()
        return False, f"{type(e).__name__}: {str(e)[:300]}"
    return True, f"{len(steps)} steps"


def finish(out: Path, table: str, headline: str, misses: Sequence[str]) -> int:
    """Writes ``out/table.md``, prints the table, the headline and each miss; returns the harness's exit code: 1
    when anything missed, else 0."""
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)
    print("\n" + headline)
    for m in misses:
        print(f"  miss: {m}")
    return 1 if misses else 0
