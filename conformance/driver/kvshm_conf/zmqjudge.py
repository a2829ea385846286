"""The ZMQ judge: an engine's KV-event stream on the vLLM wire, rebuilt by Dynamo 1.6.1's real standalone indexer.

A seeded engine (:func:`make_engine`): ``ranks`` dp ranks, one publisher per rank (vLLM's port offsets: rank ``r``
publishes on ``BASE + r`` and answers replays on ``RBASE + r``), each rank a stream of batches numbered from 0 (vLLM's
per-publisher counter; on the kvshm side kvshmd numbers the wire instead, docs/lifecycle.md: its own counter from unix
µs, the incarnation's start Cleared first, empty heartbeat batches on an idle stream: a judge's first live batch is a
gap from 0 either way). A batch holds 1..5 events: the device events of a :func:`gen.generate` stream (BlockStored
with medium ``"GPU"``, LoRA names, sometimes ``group_idx 0`` + ``kv_cache_spec_kind "full_attention"``;
BlockRemoved; AllBlocksCleared) mixed with events Dynamo must keep out of the device tree: CPU copies of root chains
(``medium "CPU"``: 1.6.1's host-pinned tier) and their removals, stores and removes of a sliding-window group
(``group_idx 1``, kind ``"sliding_window"``), and stores of a group never described (``group_idx 2``: unlearned).

The same batches are published twice, each publisher judged by its own ``kvshm_conformance.StandaloneJudge`` (1.6.1's
``WorkerRegistry``: its ZMQ listener, gap detection and DEALER replay, its normalizer and filters, its indexer):

* ``zmq/reference``: :class:`vllm_ref.RefPublisher` (vLLM 0.33.0's ZmqEventPublisher semantics, pyzmq + msgspec);
* ``zmq/kvshm``: ``kvshm.LocalIndexer(worker, block_size, publish=kvshm.ZmqPublish(...), dp_rank=r)`` +
  ``apply_batch(seq, events, dp_rank=r)`` (the daemon publishes).

Profile ``sglang-dp3`` (``wire="sglang"``) runs the same on SGLang 0.5.23's wire: the reference publishes SGLang's
structs (testdata/vllmwire/sglang_structs.py: signed int64 hashes, SGLang's BlockStored, ``attn_dp_rank``), kvshm
publishes with ``ZmqPublish(wire="sglang")`` and gets the same SGLang events (signed hashes) in ``apply_batch``.
SGLang has no KV cache groups and its host tier is not vLLM's ``"CPU"``: its streams are device events only (no
decoys, no CPU copies). It measures what Dynamo 1.6.1 does with SGLang's signed hashes: the judges' trees hold
them as u64 keys, the same 64 bits (the truth keys every hash that way).

Per side, two judges: **main** registers every rank before the first batch; its listener of one rank is paused at a
third of the stream and resumed at two thirds (``pause_listener``/``resume_listener``: the batches in between are a
gap it must fill through the replay socket). **late** registers at half the stream (its first live batch is a gap
from 0: 1.6.1 replays from 0). Checks, each counted ``identical`` when it holds and ``FAIL`` otherwise:

* each judge's device tier equals the **truth** (a reference consumer, 1.6.1's tree, fed exactly the events 1.6.1's
  worker keeps in the device tree, batch by batch);
* the replays happened: after the resume, main logged ``Gap detected`` for the paused rank and a ``Replay complete``
  with ``replayed > 0``; late logged a gap from 0 (``expected 0``) and a non-empty replay for every rank; the
  publishers served at least that many replay requests;
* ``zmq/kvshm`` only: each kvshm judge's whole state, every tier, equals the reference side's judge's. The
  host-pinned tier (the CPU events) is judged this way only: 1.6.1 keeps it in a lower-tier indexer that drops only
  the named block on a remove (its descendants stay), which the tree-based truth does not model.

Each rank's last batch stores a marker chain, so a judge whose device tier equals the truth has applied every batch
(1.6.1 keeps the listener's watermark private: the driver polls the state). While polling, the engine idles as a live
one does: each rank publishes a no-op batch (a remove of a hash never stored) every 0.2 s, so a listener that missed
the last batches live (a slow SUB connect after a resume) sees a gap and replays. After ``CONVERGE_S`` seconds the
driver gives up (the check fails, with the difference).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import kvshm_conformance as ref
from kvshm_testkit import free_port

from .gen import Profile, generate
from .ops import U64, Cleared, Event, Query, Removed, Stored
from .rebuild import Follower, state_diff
from .report import Row
from .vllm_ref import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, RefPublisher, VllmEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "testdata" / "vllmwire"))
import sglang_structs as sg  # noqa: E402  (SGLang 0.5.23's structs, for its wire)

#: Seconds a judge may take to reach the truth after the last batch was handed to the publisher.
CONVERGE_S = 30.0
#: After a listener is active: time for its SUB/DEALER TCP connections to complete before batches it must see live.
SETTLE_S = 0.3
WINDOW = 128


@dataclass(frozen=True)
class ZmqProfile:
    name: str
    worker_id: int = 61
    block_size: int = 4
    ranks: tuple[int, ...] = (0, 1, 2)
    batches: int = 36  # per rank
    lora: bool = True
    decoys: float = 0.35  # per batch: chance of one event Dynamo keeps out of the device tree
    wire: str = "vllm"  # "vllm" (0.33.0's structs) or "sglang" (SGLang 0.5.23's: device events only)


@dataclass
class RankStream:
    rank: int
    batches: list[list[VllmEvent]] = field(default_factory=list)
    device: list[list[Event]] = field(default_factory=list)  # per batch: what 1.6.1's device tree gets
    cpu: list[list[Event]] = field(default_factory=list)  # per batch: what its host-pinned tier gets
    idle: int = 0  # a hash no batch stores: the idle engine's no-op removes (heartbeats) name it


def _stored(ev: Stored, bs: int, medium: str, rng: random.Random) -> BlockStored:
    main = rng.random() < 0.3 and medium == "GPU"
    return BlockStored(
        block_hashes=[h % U64 for h in ev.hashes],
        parent_block_hash=None if ev.parent is None else ev.parent % U64,
        token_ids=list(ev.tokens),
        block_size=bs,
        lora_id=None,
        medium=medium,
        lora_name=ev.lora_name,
        group_idx=0 if main else None,
        kv_cache_spec_kind="full_attention" if main else None,
    )


def make_engine(p: ZmqProfile, seed: int) -> dict[int, RankStream]:
    """The seeded batches of every rank (each rank cut to ``p.batches`` batches)."""
    rng = random.Random(f"zmq:{p.name}:{seed}")
    gp = Profile(
        f"zmq-{p.name}", worker_id=p.worker_id, block_size=p.block_size, ranks=p.ranks,
        events=p.batches * len(p.ranks) * 4, lora=p.lora, query_rate=0.0,
    )
    events = [op for op in generate(gp, seed).ops if not isinstance(op, Query)]
    out: dict[int, RankStream] = {r: RankStream(r) for r in p.ranks}
    per_rank: dict[int, list[Event]] = {r: [ev for ev in events if ev.dp_rank == r] for r in p.ranks}
    used: set[int] = {h % U64 for ev in events if not isinstance(ev, Cleared) for h in ev.hashes}

    def fresh() -> int:
        while True:
            h = rng.randrange(1, 1 << 64)
            if h not in used:
                used.add(h)
                return h

    for r in p.ranks:
        rs = out[r]
        todo = per_rank[r]
        cpu_resident: list[int] = []
        sw_resident: list[int] = []
        i = 0
        while i < len(todo) and len(rs.batches) < p.batches:
            seq = len(rs.batches)
            n = rng.choice((1, 1, 2, 3, 4, 5))
            chunk, i = todo[i : i + n], i + n
            batch: list[VllmEvent] = []
            dev: list[Event] = []
            cpu: list[Event] = []
            for ev in chunk:
                if isinstance(ev, Stored):
                    batch.append(_stored(ev, p.block_size, "GPU", rng))
                    dev.append(Stored(seq, r, ev.tokens, ev.hashes, ev.parent, ev.lora_name))
                    if ev.parent is None and p.wire == "vllm" and rng.random() < 0.3:  # offloaded to CPU too
                        batch.append(_stored(ev, p.block_size, "CPU", rng))
                        cpu.append(Stored(seq, r, ev.tokens, ev.hashes, None, ev.lora_name))
                        cpu_resident.extend(h % U64 for h in ev.hashes)
                elif isinstance(ev, Removed):
                    main = rng.random() < 0.2
                    batch.append(BlockRemoved([h % U64 for h in ev.hashes], "GPU", group_idx=0 if main else None))
                    dev.append(Removed(seq, r, ev.hashes))
                else:
                    batch.append(AllBlocksCleared())
                    dev.append(Cleared(seq, r))
                    cpu.append(Cleared(seq, r))
                    cpu_resident.clear()
                    sw_resident.clear()
            if rng.random() < p.decoys:
                kind = rng.randrange(4)
                if kind == 0 and cpu_resident:
                    h = cpu_resident.pop(rng.randrange(len(cpu_resident)))
                    batch.insert(rng.randrange(len(batch) + 1), BlockRemoved([h], "CPU"))
                    cpu.append(Removed(seq, r, (h,)))
                elif kind == 1 and sw_resident:
                    h = sw_resident.pop(rng.randrange(len(sw_resident)))
                    batch.insert(rng.randrange(len(batch) + 1), BlockRemoved([h], "GPU", group_idx=1))
                else:
                    k = rng.choice((1, 2))
                    hashes = [fresh() for _ in range(k)]
                    toks = [rng.randrange(0, 1 << 20) for _ in range(k * p.block_size)]
                    sw = kind != 3
                    decoy = BlockStored(
                        list[bytes | int](hashes), None, toks, p.block_size, None, "GPU", None,
                        group_idx=1 if sw else 2,
                        kv_cache_spec_kind="sliding_window" if sw else None,
                        kv_cache_spec_sliding_window=WINDOW if sw else None,
                    )
                    batch.insert(rng.randrange(len(batch) + 1), decoy)
                    if sw:
                        sw_resident.extend(hashes)
            rs.batches.append(batch)
            rs.device.append(dev)
            rs.cpu.append(cpu)
        # The last batch stores a marker chain: a judge showing it has applied every batch before it.
        seq, toks, h = len(rs.batches), [rng.randrange(0, 1 << 20) for _ in range(p.block_size)], fresh()
        rs.batches.append([BlockStored([h], None, toks, p.block_size, None, "GPU", None)])
        rs.device.append([Stored(seq, r, tuple(toks), (h,))])
        rs.cpu.append([])
        rs.idle = fresh()
    return out


def truth(p: ZmqProfile, streams: dict[int, RankStream], which: str) -> str:
    """The canonical state of a 1.6.1 tree fed, batch by batch, the events of one tier."""
    f = Follower(p.worker_id, p.block_size)
    for r, rs in streams.items():
        for seq, evs in enumerate(rs.device if which == "device" else rs.cpu):
            f.live_batch(r, seq, evs)
    return f.state()


EMPTY = '{"workers":[]}'


def tiers(state: str) -> dict[str, str]:
    """A judge's state split per tier (canonical JSON each; an absent tier is the empty state)."""
    doc = json.loads(state)
    return {k: json.dumps(v, separators=(",", ":")) for k, v in doc.items()}


class Side(Protocol):
    """One engine's publishers (one per rank): publish a rank's batch, wait until everything was sent."""

    def publish(self, rank: int, seq: int, batch: list[VllmEvent]) -> None: ...

    def flush(self) -> None: ...

    def replays(self) -> int | None: ...


def sglang_events(batch: list[VllmEvent]) -> list[Any]:
    """The batch as SGLang 0.5.23's events: signed int64 hashes, SGLang's fields (the profile's events carry no
    vLLM-only field: no group, no extra keys)."""
    out: list[Any] = []
    for e in batch:
        if isinstance(e, BlockStored):
            parent = e.parent_block_hash
            out.append(sg.BlockStored([sg.signed(int(h)) for h in e.block_hashes],
                                      None if parent is None else sg.signed(int(parent)), list(e.token_ids),
                                      e.block_size, e.lora_id, e.medium, lora_name=e.lora_name))
        elif isinstance(e, BlockRemoved):
            out.append(sg.BlockRemoved([sg.signed(int(h)) for h in e.block_hashes], e.medium))
        else:
            out.append(sg.AllBlocksCleared())
    return out


class RefSide:
    def __init__(self, stack: ExitStack, ranks: tuple[int, ...], base: int, rbase: int, wire: str = "vllm") -> None:
        self.pubs: dict[int, RefPublisher] = {}
        self.wire = wire
        dp_field = "attn_dp_rank" if wire == "sglang" else "data_parallel_rank"
        for r in ranks:
            pub = RefPublisher(r, f"tcp://*:{base}", f"tcp://*:{rbase}", dp_field=dp_field)
            stack.callback(pub.close)
            self.pubs[r] = pub

    def publish(self, rank: int, seq: int, batch: list[VllmEvent]) -> None:
        if self.wire == "sglang":
            self.pubs[rank].publish(sg.KVEventBatch(time.time(), sglang_events(batch)))
            return
        self.pubs[rank].publish(KVEventBatch(time.time(), batch))

    def flush(self) -> None:
        for pub in self.pubs.values():
            pub.flush()

    def replays(self) -> int | None:
        return sum(pub.replays for pub in self.pubs.values())


class KvshmSide:
    """kvshm's producers: one ``LocalIndexer(..., publish=ZmqPublish(...), dp_rank=r)`` per rank (its own seq space,
    as vLLM runs one publisher per rank; the Python side offsets the ports by the rank)."""

    def __init__(self, stack: ExitStack, p: ZmqProfile, base: int, rbase: int) -> None:
        import kvshm

        self.wire = p.wire
        publish = kvshm.ZmqPublish(endpoint=f"tcp://*:{base}", replay_endpoint=f"tcp://*:{rbase}")
        if p.wire == "sglang":
            publish = kvshm.ZmqPublish(endpoint=publish.endpoint, replay_endpoint=publish.replay_endpoint,
                                       wire="sglang")
        self.ix: dict[int, Any] = {}
        self.sent: dict[int, int] = {}
        for r in p.ranks:
            ix = kvshm.LocalIndexer(p.worker_id, p.block_size, publish=publish, dp_rank=r)
            stack.callback(ix.shutdown)
            self.ix[r] = ix
            self.sent[r] = 0

    def publish(self, rank: int, seq: int, batch: list[VllmEvent]) -> None:
        evs = sglang_events(batch) if self.wire == "sglang" else batch
        self.ix[rank].apply_batch(seq, evs, dp_rank=rank)
        self.sent[rank] += 1

    def _zmq(self, rank: int) -> dict[str, Any]:
        z = self.ix[rank].stats().get("zmq") or {}
        return z if isinstance(z, dict) else {}

    def flush(self) -> None:
        """Until each daemon's publisher counted every batch as published or dropped (bounded). Its counter also
        counts kvshmd's own batches: the incarnation's start Cleared (one; docs/lifecycle.md) and heartbeats, which go
        out only after a second with nothing to publish, so after every batch handed to it."""
        deadline = time.monotonic() + CONVERGE_S
        for r in self.ix:
            while time.monotonic() < deadline:
                z = self._zmq(r)
                if int(z.get("published", 0)) + int(z.get("dropped", 0)) >= self.sent[r] + 1:
                    break
                time.sleep(0.01)

    def replays(self) -> int | None:
        return sum(int(self._zmq(r).get("replay_requests", 0)) for r in self.ix)


def wait_active(judge: ref.StandaloneJudge, worker_id: int, ranks: tuple[int, ...]) -> None:
    deadline = time.monotonic() + CONVERGE_S
    while time.monotonic() < deadline:
        infos = json.loads(judge.workers_json())
        st = {int(k): v["status"] for w in infos if w["instance_id"] == worker_id for k, v in w["listeners"].items()}
        if all(st.get(r) == "active" for r in ranks):
            break
        time.sleep(0.01)
    time.sleep(SETTLE_S)


def converge(
    judges: dict[str, ref.StandaloneJudge], want: dict[str, str], side: Side, streams: dict[int, RankStream]
) -> dict[str, dict[str, str]]:
    """Poll the judges until each one's tiers are ``want``'s, or ``CONVERGE_S``. Meanwhile the engine idles as a
    live one does: every 0.2 s each rank publishes a batch with one no-op remove (a hash never stored), so a listener
    that missed the last batches live (a slow SUB connect) sees a gap and replays; the truth is unchanged by it.
    Returns every judge's tiers."""
    deadline = time.monotonic() + CONVERGE_S
    beats, beat = 0, time.monotonic() + 0.2
    while True:
        got = {name: tiers(j.state()) for name, j in judges.items()}
        done = all(all(g.get(t, EMPTY) == s for t, s in want.items()) for g in got.values())
        if done or time.monotonic() > deadline:
            return got
        if time.monotonic() > beat:
            for r, rs in streams.items():
                side.publish(r, len(rs.batches) + beats, [BlockRemoved([rs.idle], "GPU")])
            beats, beat = beats + 1, time.monotonic() + 0.2
        time.sleep(0.05)


def gaps(judge: ref.StandaloneJudge, rank: int, since: int = 0) -> list[tuple[int, int]]:
    """The listener's ``Gap detected`` lines of one rank (from log line ``since`` on): (expected, got)."""
    out = []
    for _, msg, f in judge.log()[since:]:
        if msg.startswith("Gap detected") and int(f.get("self.dp_rank", f.get("dp_rank", "-1"))) == rank:
            out.append((int(f["expected"]), int(f["got"])))
    return out


def replayed(judge: ref.StandaloneJudge, rank: int, since: int = 0) -> list[int]:
    """The listener's ``Replay complete`` counts of one rank (from log line ``since`` on)."""
    return [
        int(f["replayed"])
        for _, msg, f in judge.log()[since:]
        if msg == "Replay complete" and int(f.get("dp_rank", "-1")) == rank
    ]


@dataclass
class SideResult:
    states: dict[str, dict[str, str]]  # judge name -> tier -> state


@contextmanager
def _side(kind: str, p: ZmqProfile, stack: ExitStack, base: int, rbase: int) -> Iterator[Side]:
    if kind == "reference":
        yield RefSide(stack, p.ranks, base, rbase, p.wire)
    else:
        yield KvshmSide(stack, p, base, rbase)


def run_side(kind: str, p: ZmqProfile, seed: int, streams: dict[int, RankStream], row: Row,
             log: Callable[[str], None]) -> SideResult:
    """Publish the engine's batches through one side, with the main and late judges (module doc); record checks."""
    where = f"seed={seed} {kind}"
    n = min(len(rs.batches) for rs in streams.values())  # the pause/late schedule
    total = max(len(rs.batches) for rs in streams.values())
    paused = p.ranks[1] if len(p.ranks) > 1 else p.ranks[0]
    want = {"device": truth(p, streams, "device")}
    base, rbase = free_port(len(p.ranks)), free_port(len(p.ranks))
    with ExitStack() as stack, _side(kind, p, stack, base, rbase) as side:
        main = ref.StandaloneJudge()
        for r in p.ranks:
            main.register(p.worker_id, r, f"tcp://127.0.0.1:{base + r}", f"tcp://127.0.0.1:{rbase + r}", p.block_size)
        wait_active(main, p.worker_id, p.ranks)
        late: ref.StandaloneJudge | None = None
        resumed_at = 0
        for i in range(total):
            if i == n // 3:
                side.flush()
                main.pause(p.worker_id, paused)
            if i == n // 2:
                side.flush()
                late = ref.StandaloneJudge()
                for r in p.ranks:
                    late.register(
                        p.worker_id, r, f"tcp://127.0.0.1:{base + r}", f"tcp://127.0.0.1:{rbase + r}", p.block_size
                    )
                wait_active(late, p.worker_id, p.ranks)
            if i == 2 * n // 3:
                side.flush()
                main.resume(p.worker_id, paused)
                resumed_at = len(main.log())
                wait_active(main, p.worker_id, p.ranks)
            for r in p.ranks:
                if i < len(streams[r].batches):
                    side.publish(r, i, streams[r].batches[i])
        side.flush()
        assert late is not None
        states = converge({"main": main, "late": late}, want, side, streams)
        for name, got in states.items():
            for tier, s in want.items():
                if got.get(tier, EMPTY) == s:
                    row.add("identical")
                else:
                    row.add("FAIL", f"{where}: judge {name}, tier {tier}: not the truth after {CONVERGE_S:.0f} s: "
                                    f"{state_diff(got.get(tier, EMPTY), s)}")
        g = gaps(main, paused, resumed_at)
        rp = [x for x in replayed(main, paused, resumed_at) if x > 0]
        if g and rp:
            row.add("identical")
        else:
            row.add("FAIL", f"{where}: main judge, paused rank {paused}: after the resume gaps {g}, replays "
                            f"{replayed(main, paused, resumed_at)} (want a gap filled by a replay)")
        for r in p.ranks:
            if any(e == 0 and got_ > 0 for e, got_ in gaps(late, r)) and any(x > 0 for x in replayed(late, r)):
                row.add("identical")
            else:
                row.add("FAIL", f"{where}: late judge, rank {r}: gaps {gaps(late, r)}, replays {replayed(late, r)} "
                                "(want a gap from 0 filled by a replay)")
        served = side.replays()
        if served is not None and served < 1 + len(p.ranks):
            row.add("FAIL", f"{where}: the publishers served {served} replay requests, want >= {1 + len(p.ranks)}")
        log(f"  zmq {kind} seed={seed}: {n} batches x {len(p.ranks)} ranks, {served} replays served")
        return SideResult(states)


ZMQ_PROFILES: tuple[ZmqProfile, ...] = (ZmqProfile("vllm-dp3"), ZmqProfile("sglang-dp3", decoys=0.0, wire="sglang"))


def run_zmq(p: ZmqProfile, seed: int, ref_row: Row, kvshm_row: Row, log: Callable[[str], None]) -> None:
    streams = make_engine(p, seed)
    try:
        a = run_side("reference", p, seed, streams, ref_row, log)
    except (OSError, RuntimeError, ValueError) as e:
        ref_row.add("FAIL", f"seed={seed}: the reference side could not run: {type(e).__name__}: {e}")
        a = None
    try:
        b = run_side("kvshm", p, seed, streams, kvshm_row, log)
    except (ImportError, AttributeError, OSError, RuntimeError, TypeError, ValueError) as e:
        kvshm_row.add("FAIL", f"seed={seed}: the kvshm side could not run: {type(e).__name__}: {e}")
        return
    if a is None:
        return
    for name in ("main", "late"):
        if a.states[name] == b.states[name]:
            kvshm_row.add("identical")
        else:
            diff = "; ".join(
                f"{t}: {state_diff(b.states[name].get(t, EMPTY), a.states[name].get(t, EMPTY))}"
                for t in sorted(set(a.states[name]) | set(b.states[name]))
                if a.states[name].get(t) != b.states[name].get(t)
            )
            kvshm_row.add("FAIL", f"seed={seed}: judge {name}: kvshm's stream rebuilds another state than the "
                                  f"reference publisher's: {diff}")
