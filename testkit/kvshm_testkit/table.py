"""Markdown tables as the harnesses print them (and paste into their READMEs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]], *, pad: bool = False) -> str:
    """``| a | b |`` lines under a ``|---|---|`` rule; with ``pad`` every column is padded to its widest cell (the
    rule too), for reading as plain text. Each row has as many cells as ``head``."""
    body = [list(r) for r in rows]
    for r in body:
        if len(r) != len(head):
            raise ValueError(f"markdown_table: row {r!r} has {len(r)} cells, the head {len(head)}")
    if not pad:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(out)
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(cells)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(b) for b in body)
    return "\n".join(out)
