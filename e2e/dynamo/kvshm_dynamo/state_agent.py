"""The state-agent modes: Dynamo 1.6.1's KV state agent (``python -m dynamo.kv_state_agent``) beside the same stack.

The workers opt in (``--kv-transfer-config`` with ``kv_connector_extra_config.dynamo_state_agent``: a
``raw_advertise_host`` and one CacheOwner id per global DP rank); a worker that does no longer runs its own KV relay:
the agent subscribes to the engine's raw PUB (vLLM's, or kvshmd's with ``"publisher": "kvshm"``), keeps each slot's
index and answers the router's ``Status`` / ``StateAgentRecovery`` queries. ``dynamo.vllm`` refuses a loopback or
unspecified advertise host, so the run adds a veth pair inside its namespace (:func:`veth`: ``10.200.0.1/24`` on one
end, created and removed by the run; the namespace has nothing else) and advertises that address.

Each step's row adds what the router got from the agent (the frontend's state-agent log lines, counted per step) and
what the agent cost the node (its CPU seconds and RSS beside the engine cores and kvshmd).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kvshm_e2e.table import Mode

from kvshm_testkit import Proc, cpu_seconds, http_get, markdown_table, rss_bytes, wait_until

from .judges import Decision, parse_applied
from .scenarios import ModeRun, Setup
from .stack import Frontend, Worker

ADVERTISE = "10.200.0.1"  # the only address the run adds (on its own veth, inside its own namespace)
VETH = ("kvsa0", "kvsa1")
AGENT_TIMEOUT = 60.0
# noop_connector.py, named not imported (it imports vLLM; the workers load it)
NOOP_MODULE, NOOP_NAME = "kvshm_dynamo.noop_connector", "NoopConnector"

AGENT_MODES = (
    Mode("vLLM zmq (agent)", "zmq", "none"),
    Mode("kvshm shared (agent)", "kvshm", "shared"),
)


def cache_owner(slot: int) -> str:
    """A canonical CacheOwnerId (``<32 hex>:<32 hex>/<16 hex>/<32 hex>``, dynamo.vllm's pattern): one indexer
    domain and pool for the run, one stable slot per worker (the restarted worker keeps its slot)."""
    return f"{'01' * 16}:{'02' * 16}/{'03' * 8}/{slot:032x}"


@contextmanager
def veth() -> Iterator[str]:
    """A veth pair in the current network namespace with :data:`ADVERTISE` on one end, both ends up; removed on
    exit (deleting one end deletes the pair). Yields the address. Must run inside the run's own namespace."""
    a, b = VETH
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{ADVERTISE}/24", "dev", a], check=True)
        for end in VETH:
            subprocess.run(["ip", "link", "set", end, "up"], check=True)
        yield ADVERTISE
    finally:
        subprocess.run(["ip", "link", "del", a], check=False)


class Agent:
    """``python -m dynamo.kv_state_agent``: one host, up to 8 slots, on the stack's discovery and request plane."""

    def __init__(self, env: Mapping[str, str], logdir: Path) -> None:
        # The planes as the other processes get them on their command line (stack.PLANES): the host has no flags
        # for them, dynamo_worker reads these (its discovery default is etcd).
        self.env = dict(env, DYN_DISCOVERY_BACKEND="file", DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="zmq")
        self.logdir = logdir
        self.proc: Proc | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.logdir / f"agent-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "dynamo.kv_state_agent", "--max-slots", "8"]
        proc = self.proc = Proc(f"agent {self.starts}", argv, self.log, env=self.env)

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"the state agent exited with {proc.returncode} while starting:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            return "KV state-agent host started" in self.log.read_text(errors="replace")

        wait_until("state agent started", up, AGENT_TIMEOUT, 0.5)

    def cost(self) -> tuple[float, int]:
        """(CPU seconds, RSS bytes) of the agent now; (0, 0) when it is not running."""
        if self.proc is None or not self.proc.alive():
            return 0.0, 0
        return cpu_seconds(self.proc.pid), rss_bytes(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGTERM, 20.0, group=True)
            self.proc = None


class AgentWorker(Worker):
    """A ``dynamo.vllm`` worker opted in to the state agent: its engine's PUB advertised on :data:`ADVERTISE`, one
    CacheOwner id (its global DP rank 0, the same slot in every incarnation)."""

    _before: frozenset[int] = frozenset()

    def argv(self) -> list[str]:
        # The no-op connector (noop_connector.py: vLLM 0.31.0 wants a connector for any kv_transfer_config), the
        # opt-in in its extra config.
        cfg = {"kv_connector": NOOP_NAME, "kv_connector_module_path": NOOP_MODULE, "kv_role": "kv_both",
               "kv_connector_extra_config": {"dynamo_state_agent": {
                   "raw_advertise_host": ADVERTISE, "cache_owner_ids": {"0": cache_owner(self.index)}}}}
        return [*super().argv(), "--kv-transfer-config", json.dumps(cfg)]

    def start(self, frontend: Frontend | None = None) -> None:
        self._before = frozenset(self._instances())
        super().start(frontend)

    def read_id(self) -> int | None:
        """An opted-in worker starts no KV relay, so its log never names its instance id: the one ``generate``
        instance that appeared in discovery since :meth:`start` (workers start one at a time)."""
        new = self._instances() - self._before
        return next(iter(new)) if len(new) == 1 else None

    def _instances(self) -> set[int]:
        d = Path(self.env["DYN_FILE_KV"]) / "v1" / "instances"
        return {int(m.group(1), 16) for p in (d.iterdir() if d.is_dir() else [])
                if (m := _GENERATE.fullmatch(p.name)) is not None}


_GENERATE = re.compile(r"dynamo%2Fbackend%2Fgenerate%2F([0-9a-f]+)")

# What the router logs about its state-agent path (dynamo_llm::kv_router::indexer::recovery::state_agent, 1.6.1):
# every distinct message, counted per step. What the agent answered: the router's queries by kind.
_ROUTER = re.compile(r"kv_router::indexer::recovery::state_agent: (.*?)(?= \w+=|$)", re.M)
AGENT_LINES = {"Status": "kind: Status", "StateAgentRecovery": "kind: StateAgentRecovery", "Recovery": "kind: Recovery"}
_WARN = re.compile(r"\b(WARN|ERROR)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class AgentStep:
    """What one step showed of the agent: the router's state-agent messages, the queries the agent answered, its
    warnings (each distinct message once, with its count), its cost."""

    router: dict[str, int] = field(default_factory=dict)
    agent: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  # the agent's CPU seconds over the step
    rss: int = 0  # its RSS at the step's end


class AgentRun(ModeRun):
    """A mode of :data:`AGENT_MODES`: the same steps and judges as :class:`ModeRun`, the workers opted in, the agent
    started before them and kept through every step; per step, an :class:`AgentStep`."""

    def __init__(self, setup: Setup, mode: Mode, index: int, control: dict[str, list[Decision]] | None) -> None:
        super().__init__(setup, mode, index, control)
        self.workers = [AgentWorker(w.index, w.model, w.ports, w.publisher, w.env, w.logdir) for w in self.workers]
        self.agent = Agent(self.frontend.env, self.dir)
        self.seen: list[AgentStep] = []
        self.agent_cpu = 0.0  # the agent's CPU seconds over the steady step's requests
        self._offsets: dict[Path, int] = {}
        self._cpu0 = 0.0

    def steady(self) -> list[str]:
        self.agent.start()
        return super().steady()

    def requests(self, step: str, n: int) -> list[Decision]:
        cpu0, _ = self.agent.cost()
        out = super().requests(step, n)
        if step.startswith("steady"):
            self.agent_cpu = self.agent.cost()[0] - cpu0
        return out

    def judge(self, step: str, decisions: list[Decision], notes: list[str], seconds: float) -> None:
        if not self.rows:
            time.sleep(1.0)  # as ModeRun's first-step check: the last request's events reach the router
        cpu, rss = self.agent.cost()
        agent_text = self._new_text(*self._logs("agent", self.agent.starts))
        router = _messages(self._new_text(*self._logs("frontend", self.frontend.starts)))
        seen = AgentStep(router, _count(agent_text, AGENT_LINES), _warnings(agent_text), cpu - self._cpu0, rss)
        self._cpu0 = cpu
        self.seen.append(seen)
        r = http_get(self.frontend.url + "/metrics", 5.0)
        by_type = parse_applied(r.text, by="event_type", status="ok") if r.ok else {}
        router_notes = "; ".join(f"{v}x {k}" for k, v in seen.router.items()) or "-"
        notes = [*notes, "applied by kind: " + (", ".join(f"{k} {v}" for k, v in sorted(by_type.items())) or "-"),
                 "router's state-agent path: " + router_notes,
                 "agent answered: " + (", ".join(f"{k} {v}" for k, v in seen.agent.items() if v) or "-"),
                 f"agent {seen.cpu_s:.2f} CPU s, RSS {seen.rss >> 20} MiB"]
        notes += [f"agent: {n}x {w}" for w, n in seen.warnings.items()]
        super().judge(step, decisions, notes, seconds)
        if len(self.rows) == 1:
            # ModeRun's rule is the relay's (applied = published, merged); through the agent the router also applies
            # Cleared barriers of its own (the agent's at each attachment, the router's own at each recovery): the
            # stores and removals are compared, the Cleared counted apart.
            self.checks.pop()
            moved = by_type.get("stored", 0) + by_type.get("removed", 0)
            merged = sum(w.count.merged for w in self.wire.values())
            self.checks.append((
                "steady serving: the router applied every store and removal the engines published (adjacent ones "
                "of a kind merged), through the agent", moved == merged,
                f"stored + removed applied {moved}, published {merged} merged; Cleared applied "
                f"{by_type.get('cleared', 0)}"))

    def summary(self) -> dict[str, object]:
        out = super().summary()
        out["agent_cpu_s"] = self.agent_cpu
        out["agent_steps"] = [vars(s) for s in self.seen]
        return out

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.agent.stop()

    def _logs(self, name: str, starts: int) -> list[Path]:
        return [self.dir / f"{name}-{i}.log" for i in range(1, starts + 1)]

    def _new_text(self, *paths: Path) -> str:
        """What the logs got since the last call."""
        out = []
        for path in paths:
            if not path.exists():
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                out.append(f.read().decode(errors="replace"))
                self._offsets[path] = f.tell()
        return _ANSI.sub("", "".join(out))


def _count(text: str, lines: dict[str, str]) -> dict[str, int]:
    return {k: text.count(s) for k, s in lines.items()}


def _messages(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in _ROUTER.findall(text):
        out[m] = out.get(m, 0) + 1
    return out


def _warnings(text: str) -> dict[str, int]:
    """The agent's WARN and ERROR lines, without timestamps and ids, counted."""
    out: dict[str, int] = {}
    for ln in text.splitlines():
        if _WARN.search(ln):
            key = re.sub(r"\d{4,}", "N", ln.split(" ", 1)[-1]).strip()[:200]
            out[key] = out.get(key, 0) + 1
    return out


def render_agent(runs: list[AgentRun]) -> str:
    """The agent's cost beside the engine cores and kvshmd, per request of the steady step, and its largest RSS."""
    def per_request(run: AgentRun, seconds: float) -> str:
        return f"{1000 * seconds / max(1, len(run.rows[0].decisions)):.1f} ms" if run.rows else "-"

    return markdown_table(
        ["mode", "agent CPU per request (steady step)", "engine-core CPU per request (both workers)",
         "kvshmd CPU per request", "agent's largest RSS"],
        [[run.mode.name, per_request(run, run.agent_cpu), per_request(run, run.engine_cpu),
          per_request(run, run.kvshmd_cpu) if run.mode.daemon != "none" else "n/a",
          f"{max((s.rss for s in run.seen), default=0) >> 20} MiB"] for run in runs])


__all__ = ["ADVERTISE", "AGENT_MODES", "Agent", "AgentRun", "AgentWorker", "cache_owner", "render_agent", "veth"]
