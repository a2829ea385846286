"""Rows, the lifecycle goals (docs/lifecycle.md), and the printed table."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvshm_testkit import markdown_table

CONVERGE_TIMEOUT = 10.0  # docs/lifecycle.md: a router converges to the exact state within 10 s


@dataclass(frozen=True)
class Mode:
    name: str  # the table's column label
    publisher: str  # the engine's KVEventsConfig.publisher: "zmq" (the engine's own, the control) or "kvshm"
    daemon: str  # "none", "shared" or "private"
    engine: str = "vllm"  # "vllm" or "sglang"

    @property
    def judged(self) -> bool:
        """The control rows (vLLM's own publisher) are expected to be wrong: reported, never failed on."""
        return self.publisher == "kvshm"


MODES = (
    Mode("vLLM zmq", "zmq", "none"),
    Mode("kvshm shared", "kvshm", "shared"),
    Mode("kvshm private", "kvshm", "private"),
)

# make e2e-sglang: the same lifecycle with SGLang 0.5.23, SGLang's own zmq publisher as the control.
SGLANG_MODES = (
    Mode("SGLang zmq", "zmq", "none", "sglang"),
    Mode("kvshm shared (SGLang)", "kvshm", "shared", "sglang"),
    Mode("kvshm private (SGLang)", "kvshm", "private", "sglang"),
)


@dataclass(frozen=True)
class Judged:
    """One judge's verdict after a step: extra and missing blocks against the truth, and a note."""

    extra: int
    missing: int
    note: str = ""

    @property
    def exact(self) -> bool:
        return self.extra == 0 and self.missing == 0 and self.note not in ("incomplete",)

    def cell(self) -> str:
        text = "exact" if self.extra == 0 and self.missing == 0 else f"+{self.extra} -{self.missing}"
        return f"{text} ({self.note})" if self.note else text


@dataclass
class Row:
    step: str
    mode: Mode
    truth: int  # blocks in the engine's cache (vLLM's BlockPool, SGLang's radix tree; 0 while it is down)
    router: Judged | None
    kvshmd: Judged | None  # None: no kvshmd in this mode
    seconds: float | None  # until both judges matched the truth; None: not within CONVERGE_TIMEOUT
    notes: list[str] = field(default_factory=list)
    action: float = 0.0  # seconds the step itself took (engine start, requests, kills)

    @property
    def ok(self) -> bool:
        judges = [j for j in (self.router, self.kvshmd) if j is not None]
        return all(j.exact for j in judges) and not self.notes


@dataclass
class Check:
    """A check that is not a state comparison (seqs on the wire, the private daemon's exit)."""

    name: str
    mode: Mode
    ok: bool
    detail: str


def render(rows: list[Row], checks: list[Check]) -> str:
    def conv(r: Row) -> str:
        return f"{r.seconds:.1f} s" if r.seconds is not None else f"> {CONVERGE_TIMEOUT:.0f} s"

    steps = markdown_table(
        ["step", "publisher / daemon", "truth", "router (Dynamo 1.6.1) extra/missing",
         "kvshmd /kv_recover extra/missing", "converged", "step took", "notes"],
        [[r.step, r.mode.name, str(r.truth), r.router.cell() if r.router else "n/a",
          r.kvshmd.cell() if r.kvshmd else "n/a", conv(r), f"{r.action:.0f} s", "; ".join(r.notes)] for r in rows])
    judged = markdown_table(["check", "publisher / daemon", "result"],
                            [[c.name, c.mode.name, f"{'ok' if c.ok else 'FAIL'}: {c.detail}"] for c in checks])
    return steps + "\n\n" + judged


def failures(rows: list[Row], checks: list[Check]) -> list[str]:
    """The kvshm rows and checks that miss the goals (the control rows never fail the run)."""
    out = [f"{r.step} / {r.mode.name}" for r in rows if r.mode.judged and not r.ok]
    out += [f"{c.name} / {c.mode.name}: {c.detail}" for c in checks if c.mode.judged and not c.ok]
    return out
