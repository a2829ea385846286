"""Helpers shared by the recovery benchmark and its child processes: event generators, timing, process stats.

Nothing here measures by itself; see recovery_bench.py.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

BS = 32  # tokens per block, as the engine's kv_block_size
TICKS = os.sysconf("SC_CLK_TCK")

Event = tuple[list[int], list[int], "int | None"]  # tokens, block hashes, parent hash


class ChainGen:
    """Stored events forming chains: chain c is events j = 0..per_chain-1 of `blocks` blocks each, event j's parent
    the last block of event j-1. Block hashes are unique positive ints from `base`; the first token window of each
    chain is unique so no two chains share a root node (tokens after it are a fixed list, which is cheap)."""

    def __init__(self, blocks: int, per_chain: int, base: int = 1 << 40, bs: int = BS) -> None:
        self.blocks = blocks
        self.per_chain = per_chain
        self.next_hash = base
        self.bs = bs
        self.rest = [(7 * i + 3) % 150_000 for i in range((blocks - 1) * bs)]
        self.salt = (base >> 32) % 150_000  # generators with different bases never share a token prefix
        self.chain = 0
        self.j = 0
        self.parent: int | None = None

    def next(self) -> Event:
        c, j = self.chain, self.j
        head = [self.salt, c // 150_000, c % 150_000, j] + [1] * (self.bs - 4)
        hashes = list(range(self.next_hash, self.next_hash + self.blocks))
        self.next_hash += self.blocks
        parent = self.parent
        self.j += 1
        if self.j == self.per_chain:
            self.chain, self.j, self.parent = c + 1, 0, None
        else:
            self.parent = hashes[-1]
        return head + self.rest, hashes, parent

    def take(self, n: int) -> Iterator[Event]:
        for _ in range(n):
            yield self.next()


def summary(samples_ns: Sequence[float]) -> dict[str, float]:
    """Median, p99, mean (µs) and count of samples in ns."""
    if not samples_ns:
        return {"n": 0, "median_us": float("nan"), "p99_us": float("nan"), "mean_us": float("nan")}
    s = sorted(samples_ns)
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return {"n": len(s), "median_us": statistics.median(s) / 1e3, "p99_us": p99 / 1e3,
            "mean_us": statistics.fmean(s) / 1e3}


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of another process: the sum over its live threads of their time on a CPU from
    /proc/PID/task/*/schedstat (ns; /proc/PID/stat's utime+stime count clock ticks, 10 ms each, too coarse for a
    daemon at 0.2% of a core). A thread that exits between two readings takes its time with it (kvshmd's threads
    live as long as it does); without schedstat (a kernel without CONFIG_SCHED_INFO), /proc/PID/stat's ticks."""
    total_ns, seen = 0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total_ns += int(f.read().split()[0])
            seen = True
        except (OSError, ValueError, IndexError):  # the thread exited meanwhile
            continue
    if seen:
        return total_ns / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def variant(body: bytes | str) -> str:
    """The WorkerKvQueryResponse variant name of a reply (its first key)."""
    text = body.decode() if isinstance(body, bytes) else body
    head = text[:40]
    return head.split('"')[1] if head.startswith('{"') else head


def last_event_id(body: bytes | str) -> int:
    obj: Any = json.loads(body)
    (inner,) = obj.values()
    return int(inner["last_event_id"])


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals) - idle, sum(vals)


def busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of the machine's CPU time that was busy between two machine_ticks() readings, in %."""
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total else float("nan")


def same_reply(a: str, b: str) -> str:
    """"yes" when byte-identical; "same events, order differs" when a TreeDump holds the same events in another
    order (1.6.1 orders siblings by hashbrown iteration, which no other implementation reproduces; event ids of a
    dump are positions); otherwise "no"."""
    if a == b:
        return "yes"
    try:
        ja, jb = json.loads(a), json.loads(b)
    except ValueError:
        return "no"
    if set(ja) == set(jb) == {"TreeDump"}:
        def key(e: dict[str, Any]) -> str:
            e = json.loads(json.dumps(e))
            e["event"].pop("event_id", None)
            return json.dumps(e, sort_keys=True)

        ta, tb = ja["TreeDump"], jb["TreeDump"]
        if ({k: v for k, v in ta.items() if k != "events"} == {k: v for k, v in tb.items() if k != "events"}
                and sorted(map(key, ta["events"])) == sorted(map(key, tb["events"]))):
            return "same events, order differs"
    return "no"


class JsonChild:
    """A child process spoken to in JSON lines: ``argv`` is its command; its first line is kept in ``first``."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self.recv()

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.proc.args!r} exited with {self.proc.wait()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.recv()

    def close(self) -> None:
        try:
            self.send({"op": "quit"})
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# --- the child side of JsonChild: one JSON object per line on stdin, one reply per line on stdout -----------------
def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def commands() -> Iterator[dict[str, Any]]:
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def cpu_self() -> float:
    """This process's user + system CPU seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
