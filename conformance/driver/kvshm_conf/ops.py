"""Event streams as values, and the trace format (JSON Lines) shared with the Rust replay and the Go checker.

Line 1 is the header ``{"trace":"name","worker_id":W,"block_size":B,"max_buffer_size":M}``; then one op per line:
``stored``, ``removed``, ``cleared`` (each with its ``seq`` and ``dp_rank``) and ``query`` (``start``/``end``, and
``answer``: Dynamo's ``WorkerKvQueryResponse`` JSON once recorded). Hashes are u64.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

U64 = 1 << 64


@dataclass(frozen=True)
class Stored:
    """``apply_stored(seq, tokens, hashes, parent, dp_rank, lora_name, is_eagle)``."""

    seq: int
    dp_rank: int
    tokens: tuple[int, ...]
    hashes: tuple[int, ...]
    parent: int | None = None
    lora_name: str | None = None
    is_eagle: bool | None = None


@dataclass(frozen=True)
class Removed:
    """``apply_removed(seq, hashes, dp_rank)``."""

    seq: int
    dp_rank: int
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class Cleared:
    """``apply_cleared(seq, dp_rank)``."""

    seq: int
    dp_rank: int


@dataclass(frozen=True)
class Query:
    """``get_events_json(start, end)``; ``answer`` is the reference's reply once recorded."""

    start: int | None
    end: int | None
    answer: str | None = None


Event: TypeAlias = Stored | Removed | Cleared
Op: TypeAlias = Stored | Removed | Cleared | Query


@dataclass
class Header:
    """A trace's first line: the LocalIndexer's constructor arguments."""

    name: str
    worker_id: int
    block_size: int
    max_buffer_size: int
    # Deviation id -> index (0-based, among the op lines) of the first op from which that documented difference
    # may explain an answer (conformance/README.md). Optional; readers that do not know it ignore it.
    deviations: dict[str, int] = field(default_factory=dict)


@dataclass
class Trace:
    header: Header
    ops: list[Op] = field(default_factory=list)

    def events(self) -> Iterator[Event]:
        for op in self.ops:
            if not isinstance(op, Query):
                yield op


def op_to_dict(op: Op) -> dict[str, Any]:
    """The trace line of one op (``answer`` embedded as JSON, not as a string)."""
    if isinstance(op, Stored):
        return {
            "op": "stored",
            "seq": op.seq,
            "dp_rank": op.dp_rank,
            "tokens": list(op.tokens),
            "hashes": [h % U64 for h in op.hashes],
            "parent": None if op.parent is None else op.parent % U64,
            "lora_name": op.lora_name,
            "is_eagle": op.is_eagle,
        }
    if isinstance(op, Removed):
        return {"op": "removed", "seq": op.seq, "dp_rank": op.dp_rank, "hashes": [h % U64 for h in op.hashes]}
    if isinstance(op, Cleared):
        return {"op": "cleared", "seq": op.seq, "dp_rank": op.dp_rank}
    d: dict[str, Any] = {"op": "query", "start": op.start, "end": op.end}
    if op.answer is not None:
        d["answer"] = json.loads(op.answer)
    return d


def op_json(op: Op) -> str:
    """One trace line; a query's answer is spliced in verbatim so its bytes survive the round trip."""
    if isinstance(op, Query) and op.answer is not None:
        head = json.dumps({"op": "query", "start": op.start, "end": op.end}, separators=(",", ":"))
        return head[:-1] + ',"answer":' + op.answer + "}"
    return json.dumps(op_to_dict(op), separators=(",", ":"))


def op_from_dict(d: dict[str, Any]) -> Op:
    kind = d["op"]
    if kind == "stored":
        return Stored(
            seq=int(d["seq"]),
            dp_rank=int(d["dp_rank"]),
            tokens=tuple(int(t) for t in d["tokens"]),
            hashes=tuple(int(h) for h in d["hashes"]),
            parent=None if d.get("parent") is None else int(d["parent"]),
            lora_name=d.get("lora_name"),
            is_eagle=d.get("is_eagle"),
        )
    if kind == "removed":
        return Removed(seq=int(d["seq"]), dp_rank=int(d["dp_rank"]), hashes=tuple(int(h) for h in d["hashes"]))
    if kind == "cleared":
        return Cleared(seq=int(d["seq"]), dp_rank=int(d["dp_rank"]))
    if kind == "query":
        ans = d.get("answer")
        return Query(
            start=d.get("start"),
            end=d.get("end"),
            answer=None if ans is None else json.dumps(ans, separators=(",", ":"), ensure_ascii=False),
        )
    raise ValueError(f"kvshm_conf: unknown trace op {kind!r}")


def dump_trace(trace: Trace) -> str:
    h = trace.header
    head: dict[str, Any] = {
        "trace": h.name,
        "worker_id": h.worker_id,
        "block_size": h.block_size,
        "max_buffer_size": h.max_buffer_size,
    }
    if h.deviations:
        head["deviations"] = dict(sorted(h.deviations.items()))
    lines = [json.dumps(head, separators=(",", ":"))]
    lines.extend(op_json(op) for op in trace.ops)
    return "\n".join(lines) + "\n"


def load_trace(lines: Iterable[str]) -> Trace:
    it = (ln for ln in lines if ln.strip())
    head = json.loads(next(it))
    trace = Trace(
        Header(
            name=str(head["trace"]),
            worker_id=int(head["worker_id"]),
            block_size=int(head["block_size"]),
            max_buffer_size=int(head["max_buffer_size"]),
            deviations={str(k): int(v) for k, v in head.get("deviations", {}).items()},
        )
    )
    trace.ops.extend(op_from_dict(json.loads(ln)) for ln in it)
    return trace
