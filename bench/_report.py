"""What results_report.py and node_report.py share: a goal row and the formatting of figures and tables."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testkit"))
from kvshm_testkit import markdown_table  # noqa: E402


@dataclass
class Goal:
    name: str
    target: str
    kvshm: str
    baseline: str
    ratio: float | None
    ok: bool | None  # None: not measured (skipped)
    note: str = ""
    limit: str = ""  # a MISS's measured limit, where one is known (node_report.py prints it under the table)


def us(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if x >= 10_000:
        return f"{x / 1000:,.1f} ms"
    if x >= 100:
        return f"{x:,.0f} µs"
    return f"{x:.2f} µs"


def mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB"


def verdict(ok: bool | None) -> str:
    return "skipped" if ok is None else ("**PASS**" if ok else "**MISS**")


def ratio_s(r: float | None) -> str:
    return "—" if r is None or r != r else f"{r:.2f}×"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table (kvshm_testkit.markdown_table), for a report built as a list of lines."""
    return markdown_table(header, rows).split("\n")


def emit_measured(res: dict[str, Any], text: str, out: Path | None) -> None:
    """Prints an engine benchmark's report; with ``out``, keeps its measurement there (JSON, what results_report.py
    renders) and the report beside it (``.md``)."""
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
        out.with_suffix(".md").write_text(text + "\n")
