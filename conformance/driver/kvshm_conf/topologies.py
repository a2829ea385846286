"""The real deployments end to end: producers -> shared ``kvshmd serve --http`` -> a consumer doing HTTP GETs.

Each topology runs its producers (``kvshm.LocalIndexer`` attached to one shared daemon) on seeded random streams and
delivers every event, after publishing it, to consumers built on the reference consumer (deepinfra's, on Dynamo
1.6.1's tree), exactly as a global indexer's listener sees them:

* **truth** applies every event live (a TensorRT-LLM ``apply_cleared(seq)`` means the engine dropped its whole
  cache: applied to every rank of the worker);
* **missed** drops a window of live events, then recovers on the next gap;
* **cold** starts late (its first event recovers ``start=0``);

A listener is keyed by ``(worker_id, dp_rank)``; on a gap it GETs ``{endpoint}?start=S&end=E`` (never a worker_id)
with 3 tries, applies the answer (``Consumer.apply_recovery``) and then the live event (dropped if stale). After the
last event each listener polls once more (the next event it would see). Then its state must equal the truth's.

Endpoints per topology: (a) shared daemon, several workers: ``/workers/{w}/kv_recover``; (b) vLLM, one producer
per dp rank sharing a worker_id (``LocalIndexer(..., dp_rank=r)``): ``/workers/{w}/dp/{r}/kv_recover`` and the rank
port ``BASE+r`` (``--rank-ports``), which must answer the same bytes; (c) TensorRT-LLM, one producer for all ranks:
the per-rank views at the same two places.

The forced loss: the daemon is stopped (SIGSTOP), one producer publishes more than its 64 KiB ring holds, the daemon
resumes. The next recovery must carry ``Kvshm-State: incomplete`` and ``Kvshm-Lost-Events`` naming as many ids as the
producer dropped (and ``stats()`` says ``incomplete`` with the lost ranges), and rebuild the state of a consumer that
saw every event except those (deviation D3). After the
producer's next Cleared, the recovered state equals the truth again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvshm
from kvshm_testkit import Kvshmd, Response, free_port
from kvshm_testkit import http_get as kit_http_get

from .differential import feed
from .gen import Profile, generate
from .ops import Cleared, Event, Query
from .rebuild import Follower, state_diff
from .report import Row


def http_get(url: str) -> Response:
    """GET as deepinfra's client does: a non-2xx answer is retried (3 tries), then given up."""
    return kit_http_get(url, 30.0, tries=3)


def start_daemon(kvshmd: str, rank_ports: bool) -> tuple[Kvshmd, int]:
    """A shared ``kvshmd serve --http`` in a fresh 0700 directory (``--rank-ports`` on 8 free ports when asked);
    the daemon and the base of its rank ports (0 without)."""
    rank_base = free_port(8) if rank_ports else 0
    flags = ["--log-level", "warn", *(["--rank-ports", str(rank_base)] if rank_ports else [])]
    d = Kvshmd(kvshmd, Path(tempfile.mkdtemp(prefix="kvshm-conf-")), flags=flags)
    try:
        return d.start(20.0), rank_base
    except Exception:
        shutil.rmtree(d.dir, ignore_errors=True)
        raise


@dataclass
class Producer:
    """One ``LocalIndexer``: ``dp_rank`` None is an ALL stream (TensorRT-LLM), else a per-rank stream (vLLM)."""

    worker_id: int
    dp_rank: int | None
    ranks: tuple[int, ...]
    ix: kvshm.LocalIndexer
    next_seq: int = 0

    @property
    def keys(self) -> list[tuple[int, int]]:
        return [(self.worker_id, r) for r in self.ranks]


Endpoint = Callable[[int, int, int, int], list[str]]  # (worker, rank, start, end) -> URLs to GET (same bytes)


@dataclass
class Listener:
    """One global indexer (a reference consumer) listening to some keys, recovering over HTTP on a gap."""

    name: str
    block_size: int
    endpoint: Endpoint
    row: Row
    followers: dict[int, Follower] = field(default_factory=dict)
    answers: list[Response] = field(default_factory=list)
    # Until a forced loss, every answer must be complete (no Kvshm-State header).
    allow_incomplete: bool = False

    def follower(self, worker: int) -> Follower:
        if worker not in self.followers:
            self.followers[worker] = Follower(worker, self.block_size)
        return self.followers[worker]

    def recover(self, worker: int, rank: int, start: int, end: int) -> bool:
        """GET the answer (and the same query at every other endpoint of the key: same bytes) and apply it."""
        urls = self.endpoint(worker, rank, start, end)
        got = [http_get(u) for u in urls]
        first = got[0]
        for u, a in zip(urls[1:], got[1:]):
            if (a.status, a.body) != (first.status, first.body):
                self.row.add("FAIL", f"{self.name}: {urls[0]} and {u} answer differently: "
                                     f"{first.text[:120]} / {a.text[:120]}")
            else:
                self.row.add("identical")
        if first.status != 200:
            self.row.add("FAIL", f"{self.name}: GET {urls[0]} -> {first.status} {(first.text or first.error)[:200]}")
            return False
        if "kvshm-state" in first.headers and not self.allow_incomplete:
            self.row.add("FAIL", f"{self.name}: GET {urls[0]} says Kvshm-State: {first.headers['kvshm-state']} "
                         f"(lost: {first.headers.get('kvshm-lost-events')}) though nothing was lost")
        self.answers.append(first)
        self.follower(worker).recover(rank, first.text)
        return True

    def deliver(self, worker: int, rank: int, ev: Event, truth: Follower | None = None) -> None:
        """The listener of ``(worker, rank)`` gets a live event: recover on a gap (or a cold start), then apply it.
        After a recovery the key's blocks must equal ``truth``'s (every event so far, live)."""
        f = self.follower(worker)
        kind, expected = f.observe(rank, ev.seq)
        recovered = False
        if kind == "initial" and ev.seq > 0:
            recovered = self.recover(worker, rank, 0, ev.seq)
        elif kind == "gap" and expected is not None:
            recovered = self.recover(worker, rank, expected, ev.seq)
        f.live(ev, rank)
        if recovered and truth is not None:
            self.compare(worker, rank, truth, f"after recovering at seq {ev.seq}")

    def compare(self, worker: int, rank: int, truth: Follower, what: str) -> None:
        ours, want = self.follower(worker).key_state(rank), truth.key_state(rank)
        if ours == want:
            self.row.add("same-state")
        else:
            self.row.add(
                "FAIL",
                f"{self.name} ({worker}, {rank}) {what}: {len(ours)} blocks rebuilt, the truth holds {len(want)}; "
                f"rebuilt only: {[b for b in ours if b not in want][:3]} "
                f"truth only: {[b for b in want if b not in ours][:3]}",
            )

    def poll(self, worker: int, rank: int, newest: int) -> None:
        """What the next event would trigger: recover from just after the watermark."""
        wm = self.follower(worker).watermark(rank)
        start = 0 if wm is None else wm + 1
        if start <= newest:
            self.recover(worker, rank, start, newest)

    def state(self) -> str:
        return "\n".join(self.followers[w].state() for w in sorted(self.followers))


@dataclass
class Topology:
    name: str
    daemon: Kvshmd
    producers: list[Producer]
    endpoint: Endpoint
    block_size: int = 4
    seed: int = 0


def deliver_truth(truth: dict[int, Follower], p: Producer, ev: Event, block_size: int) -> None:
    f = truth.setdefault(p.worker_id, Follower(p.worker_id, block_size))
    if p.dp_rank is None and isinstance(ev, Cleared):
        for r in p.ranks:  # TensorRT-LLM: the engine dropped its whole cache (kvshm's ALL-stream rule)
            f.live(ev, r)
    else:
        f.live(ev)


def truth_state(truth: dict[int, Follower]) -> str:
    return "\n".join(truth[w].state() for w in sorted(truth))


def streams_for(t: Topology, seed: int, events: int) -> list[list[Event]]:
    out: list[list[Event]] = []
    for i, p in enumerate(t.producers):
        prof = Profile(
            f"{t.name}-{i}",
            worker_id=p.worker_id,
            block_size=t.block_size,
            max_buffer_size=32,
            ranks=p.ranks,
            events=events,
            lora=True,
            eagle=True,
            mismatch=True,
            skips=True,
            clear_rate=0.02,
            cleared_single_rank_only=p.dp_rank is not None,  # per-rank streams: Cleared clears its rank
            first_seq=p.next_seq,
        )
        evs = [op for op in generate(prof, seed).ops if not isinstance(op, Query)]
        out.append(evs)
    return out


def interleave(seed: int, streams: list[list[Event]]) -> Iterator[tuple[int, Event]]:
    """The streams' events merged in a seeded order (each stream's own order kept)."""
    import random

    rng = random.Random(seed)
    pos = [0] * len(streams)
    while True:
        live = [i for i, s in enumerate(streams) if pos[i] < len(s)]
        if not live:
            return
        i = rng.choice(live)
        yield i, streams[i][pos[i]]
        pos[i] += 1


def run_topology(t: Topology, seed: int, row: Row, events: int = 120) -> None:
    truth: dict[int, Follower] = {}
    history: list[tuple[Producer, Event]] = []
    missed = Listener("missed", t.block_size, t.endpoint, row)
    cold = Listener("cold", t.block_size, t.endpoint, row)
    merged = list(interleave(seed, streams_for(t, seed, events)))
    gap_lo, gap_hi = len(merged) // 3, len(merged) // 3 + max(5, len(merged) // 6)
    cold_from = len(merged) // 2

    for n, (i, ev) in enumerate(merged):
        p = t.producers[i]
        if not publish(t, p, ev, row, truth, history):
            continue
        if not gap_lo <= n < gap_hi:
            missed.deliver(p.worker_id, ev.dp_rank, ev, truth[p.worker_id])
        if n >= cold_from:
            cold.deliver(p.worker_id, ev.dp_rank, ev, truth[p.worker_id])
    check(t, truth, [missed, cold], row, "after a missed window, skipped ids and a cold start")
    forced_loss(t, seed, truth, history, [missed, cold], row)


def publish(
    t: Topology, p: Producer, ev: Event, row: Row, truth: dict[int, Follower], history: list[tuple[Producer, Event]]
) -> bool:
    """Hand one event to its producer (kvshm), then to the truth (every event, live)."""
    err = feed(p.ix, ev)
    # The truth is the engine's cache: it holds the event whether or not kvshm took it.
    deliver_truth(truth, p, ev, t.block_size)
    history.append((p, ev))
    p.next_seq = ev.seq + 1
    if err is not None:
        row.add("FAIL", f"{t.name}: kvshm refused {ev}: {err}")
        return False
    return True


def check(t: Topology, truth: dict[int, Follower], listeners: list[Listener], row: Row, what: str) -> None:
    for lst in listeners:
        for p in t.producers:
            for w, r in p.keys:
                lst.poll(w, r, p.next_seq - 1)
        if lst.state() == truth_state(truth):
            row.add("same-state")
        else:
            diffs = [state_diff(lst.followers[w].state(), truth[w].state())
                     for w in sorted(truth) if w in lst.followers]
            row.add("FAIL", f"{t.name}/{lst.name} seed={t.seed} {what}: rebuilt state differs from the truth: {diffs}")


def lost_ids(header: str) -> set[int]:
    """The ids of a ``Kvshm-Lost-Events`` header (``80-80,95-97``; ``unknown-N`` marks are skipped)."""
    out: set[int] = set()
    for part in header.split(","):
        part = part.strip()
        if not part or part.startswith("unknown"):
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def forced_loss(
    t: Topology,
    seed: int,
    truth: dict[int, Follower],
    history: list[tuple[Producer, Event]],
    listeners: list[Listener],
    row: Row,
) -> None:
    """Ring full while the daemon is stopped: the answer is best-effort and says so (D3); a Cleared re-bases."""
    p = t.producers[0]
    before = int(p.ix.stats().get("dropped_events") or 0)
    prof = Profile(
        f"{t.name}-loss",
        worker_id=p.worker_id,
        block_size=t.block_size,
        ranks=p.ranks,
        events=900,
        cleared=False,
        first_seq=p.next_seq,
    )
    burst = [op for op in generate(prof, seed).ops if not isinstance(op, Query)]
    t.daemon.pause()
    try:
        for ev in burst:
            publish(t, p, ev, row, truth, history)  # the listeners miss the whole burst
    finally:
        t.daemon.resume()
    dropped = int(p.ix.stats().get("dropped_events") or 0) - before
    if dropped == 0:
        row.add("FAIL", f"{t.name}: the forced loss dropped nothing (ring larger than the burst?)")
        return
    for each in listeners:
        each.allow_incomplete = True  # answers crossing the lost ids are marked from now on
    lst = listeners[0]
    f = lst.follower(p.worker_id)
    for w, r in p.keys:
        wm = f.watermark(r)
        start = 0 if wm is None else wm + 1
        url = t.endpoint(w, r, start, p.next_seq - 1)[0]
        a = http_get(url)
        lost = lost_ids(a.headers.get("kvshm-lost-events", ""))
        if a.status != 200 or a.headers.get("kvshm-state") != "incomplete" or len(lost) != dropped:
            row.add(
                "FAIL",
                f"{t.name}: after {dropped} dropped events GET {url} -> {a.status} "
                f"Kvshm-State={a.headers.get('kvshm-state')!r} "
                f"Kvshm-Lost-Events={a.headers.get('kvshm-lost-events')!r}",
            )
            return
        f.recover(r, a.text)
        lst.answers.append(a)
    st = p.ix.stats()
    if st.get("incomplete") is not True or not st.get("lost_ranges"):
        row.add("FAIL", f"{t.name}: stats() after the loss: incomplete={st.get('incomplete')!r} "
                f"lost_ranges={st.get('lost_ranges')!r}")
    # What Dynamo would answer from the events kvshm did apply: every event of this worker but the lost ones.
    applied: dict[int, Follower] = {}
    for q, ev in history:
        if q.worker_id == p.worker_id and not (q is p and ev.seq in lost):
            deliver_truth(applied, q, ev, t.block_size)
    if f.state() == applied[p.worker_id].state():
        row.add("D3")
    else:
        row.add(
            "FAIL",
            f"{t.name} seed={seed}: the best-effort answer after a loss of ids {sorted(lost)[:3]}..{max(lost)} "
            f"does not rebuild the applied events' state: {state_diff(f.state(), applied[p.worker_id].state())}",
        )
    # The engine's next Cleared re-bases the stream; then recovery is exact again.
    rebase = Cleared(p.next_seq, p.ranks[0])
    publish(t, p, rebase, row, truth, history)
    for lst2 in listeners:
        lst2.deliver(p.worker_id, rebase.dp_rank, rebase, truth[p.worker_id])
    prof2 = Profile(
        f"{t.name}-after",
        worker_id=p.worker_id,
        block_size=t.block_size,
        ranks=p.ranks,
        events=40,
        cleared=False,
        first_seq=p.next_seq,
    )
    for ev in (op for op in generate(prof2, seed).ops if not isinstance(op, Query)):
        if publish(t, p, ev, row, truth, history):
            for lst2 in listeners:
                lst2.deliver(p.worker_id, ev.dp_rank, ev, truth[p.worker_id])
    check(t, truth, listeners, row, "after a forced loss and a Cleared")


@contextmanager
def topology(name: str, kvshmd: str, seed: int) -> Iterator[Topology]:
    """(a) shared, (b) vllm, (c) trtllm: the daemon, the producers and the consumer's endpoints."""
    bs = 4
    d, rank_base = start_daemon(kvshmd, rank_ports=name != "shared")
    sock = str(d.socket)

    def rank_url(r: int, path: str) -> str:
        return f"http://127.0.0.1:{rank_base + r}{path}"

    producers: list[Producer] = []
    try:
        if name == "shared":
            for w in (11, 12, 13):
                ix = kvshm.LocalIndexer(w, bs, 32, socket_path=sock, ring_bytes=65536)
                producers.append(Producer(w, None, (0,), ix))

            def endpoint(w: int, r: int, s: int, e: int) -> list[str]:
                return [d.url(f"/workers/{w}/kv_recover?start={s}&end={e}")]
        elif name == "vllm":
            for r in (0, 1, 2):
                per_rank: dict[str, Any] = {"dp_rank": r}  # one stream per rank, as vLLM publishes
                ix = kvshm.LocalIndexer(21, bs, 32, socket_path=sock, ring_bytes=65536, **per_rank)
                producers.append(Producer(21, r, (r,), ix))

            def endpoint(w: int, r: int, s: int, e: int) -> list[str]:
                return [
                    d.url(f"/workers/{w}/dp/{r}/kv_recover?start={s}&end={e}"),
                    rank_url(r, f"/kv_recover?start={s}&end={e}"),
                ]
        elif name == "trtllm":
            ix = kvshm.LocalIndexer(31, bs, 32, socket_path=sock, ring_bytes=65536)
            producers.append(Producer(31, None, (0, 1, 2), ix))

            def endpoint(w: int, r: int, s: int, e: int) -> list[str]:
                return [
                    d.url(f"/workers/{w}/dp/{r}/kv_recover?start={s}&end={e}"),
                    rank_url(r, f"/kv_recover?start={s}&end={e}"),
                ]
        else:
            raise ValueError(f"kvshm_conf: unknown topology {name!r}")
        yield Topology(name, d, producers, endpoint, bs, seed)
    finally:
        for p in producers:
            p.ix.shutdown()
        d.stop(10.0)
        shutil.rmtree(d.dir, ignore_errors=True)


TOPOLOGIES = ("shared", "vllm", "trtllm")
