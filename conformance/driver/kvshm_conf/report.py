"""The one summary table: scenario x {identical, same state, documented deviation, FAIL}."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvshm_testkit import markdown_table


@dataclass
class Row:
    scenario: str
    identical: int = 0
    same_state: int = 0
    deviations: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def add(self, outcome: str, detail: str = "") -> None:
        """``outcome`` is ``identical``, ``same-state``, a deviation id, or ``FAIL``."""
        if outcome == "identical":
            self.identical += 1
        elif outcome == "same-state":
            self.same_state += 1
        elif outcome == "FAIL":
            self.failures.append(detail)
        else:
            self.deviations[outcome] += 1


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def row(self, scenario: str) -> Row:
        for r in self.rows:
            if r.scenario == scenario:
                return r
        r = Row(scenario)
        self.rows.append(r)
        return r

    @property
    def failed(self) -> bool:
        return any(r.failures for r in self.rows)

    def table(self) -> str:
        """A Markdown table (pasted as is into conformance/README.md)."""
        head = ["scenario", "identical", "same state", "documented deviation", "FAIL"]
        body: list[list[str]] = []
        tot = Row("total")
        for r in self.rows:
            dev = ", ".join(f"{k}: {v}" for k, v in sorted(r.deviations.items())) or "0"
            body.append([r.scenario, str(r.identical), str(r.same_state), dev, str(len(r.failures))])
            tot.identical += r.identical
            tot.same_state += r.same_state
            tot.deviations.update(r.deviations)
            tot.failures.extend(r.failures)
        dev = ", ".join(f"{k}: {v}" for k, v in sorted(tot.deviations.items())) or "0"
        body.append(["**total**", str(tot.identical), str(tot.same_state), dev, str(len(tot.failures))])
        return markdown_table(head, body, pad=True)

    def failure_details(self, per_row: int = 4) -> str:
        """The first failures of every row (each says how to replay it: the seed and the op)."""
        lines: list[str] = []
        for r in self.rows:
            for d in r.failures[:per_row]:
                lines.append(f"FAIL {r.scenario}: {d}")
            if len(r.failures) > per_row:
                lines.append(f"FAIL {r.scenario}: ... {len(r.failures) - per_row} more")
        return "\n".join(lines)
