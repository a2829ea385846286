"""End to end, the way real deployments run kvshm: the real kvshmd (shared, with --http) and LocalIndexers as the
engines drive them, answers read the way the global indexer reads them (GET /kv_recover?start=&end=).

* vLLM (deepinfra fork): skips feeding some events after they took a seq; one LocalIndexer per dp rank, each with
  its own seq space (``dp_rank=``), reached per rank (``/workers/{w}/dp/{r}/kv_recover`` or a rank port).
* TensorRT-LLM: one LocalIndexer for every rank of the worker; ``apply_cleared(seq)`` without a rank.
* A shared kvshmd for every worker of a node, each reachable by a URL without a query parameter.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvshm._client import Client
from kvshm_testkit import free_port

from conftest import IndexerFactory
from helpers import (
    SharedDaemon,
    dump_blocks,
    event_ids,
    http_get,
    query,
    toks,
    variant,
    wait_for,
)

BS = 4


def start_daemon(short_dir: Path, *args: str) -> SharedDaemon:
    d = SharedDaemon(str(short_dir / "kvshmd.sock"), short_dir / "kvshmd.log", args=args)
    d.start()
    return d


@pytest.fixture
def http_daemon(short_dir: Path) -> Iterator[tuple[SharedDaemon, int]]:
    """A shared kvshmd with --http on a free loopback port."""
    port = free_port(1)
    d = start_daemon(short_dir, "--http", f"127.0.0.1:{port}")
    wait_for(lambda: http_get(port, "/healthz").status == 200, "the HTTP listener")
    yield d, port
    d.stop()


def blocks_of(body: str | bytes) -> set[tuple[int, int | None, int]]:
    return {(dp, parent, bh) for dp, parent, bh, _ in dump_blocks(json.loads(body))}


def test_skipped_ids_are_not_a_loss(http_daemon: tuple[SharedDaemon, int], make_indexer: IndexerFactory) -> None:
    """vLLM's publisher takes a seq for an event and then does not feed it (id 80 here): a cold-starting global
    indexer (start=0, older than the buffer) gets a TreeDump, an Events query across 80 gets the events around it,
    and nothing is reported lost (the issue's first finding: it used to answer Error until the next Cleared)."""
    d, port = http_daemon
    ix = make_indexer(worker_id=40, kv_block_size=BS, max_buffer_size=50, socket_path=d.socket_path)
    sent = [s for s in range(121) if s != 80]
    for s in sent:
        ix.apply_stored(s, toks(s * BS, BS), [s + 1])
    body = ix.get_events_json(0, 120)
    resp = query(ix, 0, 120)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == 120, body[:300]
    assert blocks_of(body) == {(0, None, s + 1) for s in sent}
    assert event_ids(query(ix, 75, 120)) == [75, 76, 77, 78, 79, *range(81, 121)]
    # The consumer's request, over HTTP: the same bytes, and no loss headers.
    reply = http_get(port, "/kv_recover?start=0&end=120")
    assert reply.status == 200 and reply.body == body.encode()
    assert "kvshm-state" not in reply.headers and "kvshm-lost-events" not in reply.headers, reply.headers
    st = ix.stats()
    assert st["incomplete"] is False and not st["lost_ranges"] and st["dropped_events"] == 0, st


def test_shared_daemon_two_workers_per_worker_urls(
    http_daemon: tuple[SharedDaemon, int], make_indexer: IndexerFactory
) -> None:
    """Two workers on one shared kvshmd: /kv_recover without a worker is ambiguous (409 naming the per-worker URLs),
    and each worker's URL (what /register is given) answers for that worker only."""
    d, port = http_daemon
    a = make_indexer(worker_id=1, kv_block_size=BS, socket_path=d.socket_path)
    b = make_indexer(worker_id=2, kv_block_size=BS, socket_path=d.socket_path)
    a.apply_stored(0, toks(0, BS), [11])
    b.apply_stored(0, toks(100, BS), [21])
    b.apply_stored(1, toks(104, BS), [22], parent_hash=21)
    want_a, want_b = a.get_events_json(0, 0), b.get_events_json(0, 1)
    assert event_ids(query(a, 0)) == [0] and event_ids(query(b, 0)) == [0, 1]

    ambiguous = http_get(port, "/kv_recover?start=0&end=1")
    assert ambiguous.status == 409, ambiguous
    assert b"/workers/1/kv_recover" in ambiguous.body and b"/workers/2/kv_recover" in ambiguous.body
    for path, want in (
        ("/workers/1/kv_recover?start=0&end=0", want_a),
        ("/workers/2/kv_recover?start=0&end=1", want_b),
    ):
        reply = http_get(port, path)
        assert reply.status == 200 and reply.body == want.encode(), (path, reply)
    cold = http_get(port, "/workers/2/kv_recover?start=0&end=5")  # a cold start after b's buffer: still Events
    assert cold.status == 200 and [e["worker_id"] for e in cold.json()["Events"]["events"]] == [2, 2]


def test_vllm_per_rank_producers_share_a_worker_id(short_dir: Path, make_indexer: IndexerFactory) -> None:
    """vLLM: one LocalIndexer per dp rank of one worker_id, each with its own seq space, sharing one kvshmd; each
    rank is reachable by its URL and by its rank port (recover_port + dp_rank, pod discovery)."""
    port = free_port(1)
    base = free_port(2)
    while base <= port < base + 2:
        base = free_port(2)
    d = start_daemon(short_dir, "--http", f"127.0.0.1:{port}", "--rank-ports", str(base))
    try:
        wait_for(lambda: http_get(port, "/healthz").status == 200, "the HTTP listener")
        r0 = make_indexer(worker_id=5, kv_block_size=BS, socket_path=d.socket_path, dp_rank=0)
        r1 = make_indexer(worker_id=5, kv_block_size=BS, socket_path=d.socket_path, dp_rank=np.int64(1))
        assert r0.stats()["attached"] and r1.stats()["attached"]
        r0.apply_stored(0, toks(0, BS), [10])
        r0.apply_stored(1, toks(BS, BS), [11], parent_hash=10)
        r1.apply_stored(0, toks(0, BS), [10])  # its own ids from 0, the same block on another rank
        r1.apply_stored(1, toks(50, BS), [20], dp_rank=1)
        r1.apply_cleared(2)  # this rank's producer dropped its cache: rank 1 only
        r1.apply_stored(3, toks(60, BS), [30], dp_rank=np.uint32(1))

        e0, e1 = query(r0, 0), query(r1, 0)
        assert event_ids(e0) == [0, 1] and {e["event"]["dp_rank"] for e in e0["Events"]["events"]} == {0}
        assert event_ids(e1) == [0, 1, 2, 3] and {e["event"]["dp_rank"] for e in e1["Events"]["events"]} == {1}
        d0, d1 = r0.get_events_json(), r1.get_events_json()
        assert blocks_of(d0) == {(0, None, 10), (0, 10, 11)}  # rank 1's Cleared did not touch rank 0
        assert blocks_of(d1) == {(1, None, 30)}

        # HTTP: the worker's URL is ambiguous; each rank's URL and rank port answer that rank, byte for byte.
        ambiguous = http_get(port, "/workers/5/kv_recover?start=0&end=1")
        assert ambiguous.status == 409 and b"/workers/5/dp/0/kv_recover" in ambiguous.body, ambiguous
        assert b"/workers/5/dp/1/kv_recover" in ambiguous.body
        assert http_get(port, "/workers/5/dp/1/kv_recover?start=0&end=3").body == r1.get_events_json(0, 3).encode()
        for rank, ix in ((0, r0), (1, r1)):
            reply = http_get(base + rank, "/kv_recover?start=0&end=1")
            assert reply.status == 200 and reply.body == ix.get_events_json(0, 1).encode(), (rank, reply)

        # The indexer stands for its rank: events of another rank are a programmer error, refused before writing.
        published = r1.stats(daemon=False)["published_events"]
        with pytest.raises(ValueError, match="dp_rank 1 only"):
            r1.apply_stored(4, toks(0, BS), [1], dp_rank=0)
        with pytest.raises(ValueError, match="dp_rank 1 only"):
            r1.apply_removed(4, [30], dp_rank=2)
        with pytest.raises(ValueError, match="dp_rank 1 only"):
            r1.apply_cleared(4, dp_rank=0)
        with pytest.raises(TypeError, match="dp_rank"):
            r1.apply_cleared(4, dp_rank="1")  # type: ignore[arg-type]
        assert r1.stats(daemon=False)["published_events"] == published

        st = r1.stats()
        assert st["daemon_stream"] is not None, st
        assert st["dp_rank"] == 1 and st["daemon_stream"]["dp_rank"] == 1 and st["incomplete"] is False, st
        assert "dp_rank=1" in repr(r1)

        # A second live producer for (5, rank 1) is refused (conflict); it keeps retrying, publishing into its ring.
        dup = make_indexer(worker_id=5, kv_block_size=BS, socket_path=d.socket_path, dp_rank=1)
        dst = dup.stats(daemon=False)
        assert not dst["attached"] and "conflict" in (dst["last_error"] or ""), dst
        dup.shutdown()

        # Shutting rank 0 down detaches exactly its stream and ends its incarnation (docs/lifecycle.md): it stays
        # queryable, with a Cleared under the id after its last (none of its blocks); rank 1 is untouched.
        r0.shutdown()
        with Client(d.socket_path, timeout=10) as c:
            streams = {s["dp_rank"]: s for s in c.stats(5)["streams"]}
        assert not streams[0]["attached"] and streams[1]["attached"], streams
        ended = http_get(base, "/kv_recover?start=0&end=1").json()  # the rank port too (end is ignored: Dynamo's)
        assert event_ids(ended) == [0, 1, 2] and ended["Events"]["events"][2]["event"]["data"] == "cleared", ended
        assert blocks_of(http_get(port, "/workers/5/dp/0/kv_recover").body) == set()
        assert event_ids(query(r1, 3)) == [3] and blocks_of(r1.get_events_json()) == {(1, None, 30)}
    finally:
        d.stop()


def test_trtllm_one_producer_for_every_rank(
    http_daemon: tuple[SharedDaemon, int], make_indexer: IndexerFactory
) -> None:
    """TensorRT-LLM: one LocalIndexer for all ranks of a worker; apply_cleared(seq) has no rank and clears the
    worker; each rank's URL answers that rank's view (its events plus every Cleared, its blocks, the stream's
    last_event_id). A second producer for the same worker without dp_rank is refused with a hint."""
    d, port = http_daemon
    ix = make_indexer(worker_id=6, kv_block_size=BS, socket_path=d.socket_path)
    ix.apply_stored(0, toks(0, BS), [1], dp_rank=0)
    ix.apply_stored(1, toks(0, BS), [1], dp_rank=1)
    ix.apply_stored(2, toks(8, BS), [2], parent_hash=1, dp_rank=1)
    ix.apply_cleared(3)  # no rank: the whole worker
    ix.apply_stored(4, toks(20, BS), [5], dp_rank=1)
    assert blocks_of(ix.get_events_json()) == {(1, None, 5)}

    rank1 = http_get(port, "/workers/6/dp/1/kv_recover?start=0&end=4")
    assert rank1.status == 200 and [e["event"]["event_id"] for e in rank1.json()["Events"]["events"]] == [1, 2, 3, 4]
    dump1 = http_get(port, "/workers/6/dp/1/kv_recover")
    assert blocks_of(dump1.body) == {(1, None, 5)} and dump1.json()["TreeDump"]["last_event_id"] == 4
    dump0 = http_get(port, "/workers/6/dp/0/kv_recover")
    assert dump0.json()["TreeDump"]["events"] == [] and dump0.json()["TreeDump"]["last_event_id"] == 4

    other = make_indexer(worker_id=6, kv_block_size=BS, socket_path=d.socket_path)
    st = other.stats(daemon=False)
    assert not st["attached"] and "dp_rank" in (st["last_error"] or ""), st
    assert ix.stats()["attached"]


def test_dp_rank_from_the_environment(make_indexer: IndexerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """KVSHM_DP_RANK makes an unchanged engine (vLLM builds LocalIndexer(worker_id, block_size, buffer_steps))
    a per-rank producer; the argument wins over the environment."""
    monkeypatch.setenv("KVSHM_DP_RANK", "3")
    ix = make_indexer(worker_id=8, kv_block_size=BS)
    assert ix.stats()["dp_rank"] == 3
    ix.apply_stored(0, toks(0, BS), [7])  # no dp_rank: the indexer's
    ix.apply_cleared(1)
    assert [e["event"]["dp_rank"] for e in query(ix, 0)["Events"]["events"]] == [3, 3]
    assert make_indexer(worker_id=9, kv_block_size=BS, dp_rank=0).stats()["dp_rank"] == 0
    monkeypatch.setenv("KVSHM_DP_RANK", "")
    assert make_indexer(worker_id=10, kv_block_size=BS).stats()["dp_rank"] is None
