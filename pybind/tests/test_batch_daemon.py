"""apply_batch and publish= through a real kvshmd: the ZMQ stream a pyzmq subscriber receives is
byte-identical to what vLLM's publisher sends for the same batches (msgspec over vLLM 0.33.0-shaped Structs) under
kvshmd's strictly increasing wire seqs (docs/lifecycle.md), the index numbers every event of a batch with the batch's
wire seq (the engine's seq on a stream kvshmd does not publish), stats pass the daemon's zmq counters through, and the
per-event fallback for a daemon without BATCH records."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from vllm_shapes import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode,
    is_heartbeat,
    join,
    recv_batch,
    sub_socket,
    vllm_payload,
    warm_up,
)

import kvshm
from kvshm import LocalIndexer, ZmqPublish
from kvshm import events as ke

from helpers import SharedDaemon, event_ids, query, variant, wait_for


def test_publish_batches_vllm_wire(make_indexer: Any, short_dir: Path) -> None:
    endpoint = f"ipc://{short_dir}/pub.sock"
    replay = f"ipc://{short_dir}/replay.sock"
    ix = make_indexer(publish=ZmqPublish(endpoint=endpoint, replay_endpoint=replay, topic="kv"))
    st = ix.stats()
    assert st["batches_supported"] is True and st["publishing"] is True
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    # Eagle token pairs (vLLM's and Dynamo's wire form), outside the declared list[int] on purpose.
    eagle_pairs: Any = [(t, t + 1) for t in range(30, 38)]
    try:
        wire, seq = join(ix, sub)
        wires: list[int] = []
        cases: list[tuple[list[Any], list[Any]]] = [
            (  # the common vLLM batch: stored + removed on the GPU tier
                [ke.BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None),
                 ke.BlockRemoved([5], "GPU")],
                [BlockStored([11, 12], None, list(range(8)), 4, None, "GPU", None), BlockRemoved([5], "GPU")],
            ),
            (  # every metadata field, a LoRA, a parent, a CPU-tier event (published, not indexed)
                [ke.BlockStored([13], 12, [8, 9, 10, 11], 4, 7, "GPU", "lora-a", extra_keys=[("lora-a",)],
                                group_idx=0, kv_cache_spec_kind="full_attention"),
                 ke.BlockStored([99], None, [1, 2, 3, 4], 4, None, "CPU", None),
                 ke.AllBlocksCleared()],
                [BlockStored([13], 12, [8, 9, 10, 11], 4, 7, "GPU", "lora-a", extra_keys=[("lora-a",)],
                             group_idx=0, kv_cache_spec_kind="full_attention"),
                 BlockStored([99], None, [1, 2, 3, 4], 4, None, "CPU", None),
                 AllBlocksCleared()],
            ),
            (  # Eagle: vLLM's token pairs [s[i], s[i+1]] over the stream of 2 blocks x 4 + 1 tokens, both ways
                [ke.BlockStored([21, 22], None, eagle_pairs, 4, None, "GPU", None)],
                [BlockStored([21, 22], None, eagle_pairs, 4, None, "GPU", None)],
            ),
        ]
        for i, (ours, theirs) in enumerate(cases):
            ts = 1700000000.5 + i
            ix.apply_batch(seq + i, ours, ts=ts)
            topic, wire, payload = recv_batch(sub, wire)
            assert topic == b"kv"
            assert payload == vllm_payload(ts, theirs, 0), (msgspec.msgpack.decode(payload), theirs)
            wires.append(wire)
        # The index holds the batch's events under its wire seq (the CPU event excluded: the device-tree filter).
        resp = query(ix, wires[0])
        assert variant(resp) == "Events"
        w0, w1, w2 = wires
        assert event_ids(resp) == [w0, w0, w1, w1, w2]
        # The daemon's zmq counters pass through stats().
        def zmq_published() -> bool:
            z = ix.stats()["zmq"]
            return isinstance(z, dict) and z.get("published", 0) >= seq + 4  # with the incarnation's start Cleared
        wait_for(zmq_published, "stats()['zmq'] to count the published batches")
        st = ix.stats()
        assert st["batch"]["records"] == seq + 3 and st["batch"]["fallback_batches"] == 0
        assert st["publish"]["endpoint"] == endpoint
    finally:
        sub.close(0)
        ctx.term()


@pytest.mark.parametrize("release", ["0.32", "0.31"])
def test_publish_wire_per_vllm_release(make_indexer: Any, short_dir: Path, release: str) -> None:
    """ZmqPublish(wire="0.32"): the stream is byte-identical to vLLM 0.32.0's (its BlockStored has one field less:
    msgspec writes a fixmap header, not 0.33.0's map16); wire="0.31" to vLLM 0.31.0's (the same layout)."""
    endpoint = f"ipc://{short_dir}/pub.sock"
    ix = make_indexer(publish=ZmqPublish(endpoint=endpoint, topic="kv", wire=release))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    try:
        wire, seq = join(ix, sub)
        theirs = [BlockStored([11, 12], 10, list(range(8)), 4, None, "GPU", None), BlockRemoved([5], "GPU")]
        ix.apply_batch(seq, [ke.BlockStored([11, 12], 10, list(range(8)), 4, None, "GPU", None),
                             ke.BlockRemoved([5], "GPU")], ts=2.5)
        _, _, payload = recv_batch(sub, wire)
        assert payload == vllm_payload(2.5, theirs, 0, release) != vllm_payload(2.5, theirs, 0, "0.33")
    finally:
        sub.close(0)
        ctx.term()
    assert ZmqPublish().to_json().get("wire") is None, "the default is not sent (older daemons refuse the field)"
    assert ZmqPublish(wire=release).for_rank(1).wire == release
    with pytest.raises(ValueError, match="0.33"):
        ZmqPublish(wire="0.30")
    with pytest.raises(TypeError):
        ZmqPublish(wire=0.32)  # type: ignore[arg-type]


def test_publish_wire_array(make_indexer: Any, short_dir: Path) -> None:
    """ZmqPublish(wire="array"): each event is a positional array, the tag then vLLM 0.32.0's fields in order with
    None where unset (the layout llm-d-kv-cache decodes; vllmwire's TestWireArrayIsMsgspecArrayLike has the bytes)."""
    endpoint = f"ipc://{short_dir}/pub.sock"
    ix = make_indexer(publish=ZmqPublish(endpoint=endpoint, topic="kv", wire="array"))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    try:
        wire, seq = join(ix, sub)
        ix.apply_batch(seq, [ke.BlockStored([11, 12], 10, list(range(8)), 4, None, "GPU", None),
                             ke.BlockRemoved([5], "GPU"), ke.AllBlocksCleared()], ts=2.5)
        _, _, payload = recv_batch(sub, wire)
        ts, events, dp = decode(payload)
        assert (ts, dp) == (2.5, 0)
        assert events == [["BlockStored", [11, 12], 10, list(range(8)), 4, None, "GPU", None, None, None, None, None,
                           None, None, None],
                          ["BlockRemoved", [5], "GPU", None, None, None], ["AllBlocksCleared"]]
    finally:
        sub.close(0)
        ctx.term()
    assert ZmqPublish(wire="array").for_rank(1).wire == "array"


def test_bytes_block_hashes(make_indexer: Any, short_dir: Path) -> None:
    """vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends bytes hashes (sha256 digests): published as msgpack bin,
    as vLLM's msgspec does, and indexed under their last 8 bytes, big-endian (vLLM's own int form of the same
    hash, and newer Dynamo's rule for bytes)."""
    endpoint = f"ipc://{short_dir}/pub.sock"
    ix = make_indexer(publish=ZmqPublish(endpoint=endpoint, topic="kv"))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    h = [bytes([i]) * 24 + i.to_bytes(8, "big") for i in range(1, 4)]  # keys 1, 2, 3
    try:
        wire, seq = join(ix, sub)
        first = wire + 1
        batches: list[list[Any]] = [
            [BlockStored(list[bytes | int](h[1:]), h[0], list(range(8)), 4, None, "GPU", None),
             BlockRemoved([h[2]], "GPU")],
            [BlockStored([h[0]], None, [9, 9, 9, 9], 4, None, "GPU", None, group_idx=0)],
        ]
        for i, evs in enumerate(batches):
            ix.apply_batch(seq + i, evs, ts=3.0)
            _, wire, payload = recv_batch(sub, wire)
            assert payload == vllm_payload(3.0, evs, 0), (msgspec.msgpack.decode(payload), evs)
            first = min(first, wire)
        (body,) = query(ix, first).values()
        stored = [e["event"]["data"]["stored"] for e in body["events"] if "stored" in e["event"]["data"]]
        assert [b["block_hash"] for b in stored[0]["blocks"]] == [2, 3] and stored[0]["parent_hash"] == 1
        removed = [e["event"]["data"]["removed"] for e in body["events"] if "removed" in e["event"]["data"]]
        assert removed[0]["block_hashes"] == [3]
        with pytest.raises(TypeError, match="mixes bytes"):
            ix.apply_batch(seq + 9, [ke.BlockRemoved([h[0], 7], "GPU")])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="32 and 2 bytes"):
            ix.apply_batch(seq + 9, [ke.BlockRemoved([h[0], b"ab"], "GPU")])
    finally:
        sub.close(0)
        ctx.term()


def test_dp_rank_offsets_ports() -> None:
    p = ZmqPublish(endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558")
    assert p.for_rank(2) == ZmqPublish(endpoint="tcp://*:5559", replay_endpoint="tcp://*:5560")
    assert p.for_rank(0) is p and p.for_rank(None) is p
    assert ZmqPublish(endpoint="tcp://*:0").for_rank(3).endpoint == "tcp://*:0"
    assert ZmqPublish(endpoint="inproc://x").for_rank(1).endpoint == "inproc://x_dp1"
    with pytest.raises(ValueError, match="inproc' or 'tcp"):
        ZmqPublish(endpoint="ipc:///tmp/x").for_rank(1)
    with pytest.raises(TypeError):
        ZmqPublish(hwm="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ZmqPublish(buffer_steps=-1)
    with pytest.raises(TypeError):
        LocalIndexer(1, 4, publish={"endpoint": "tcp://*:5557"})  # type: ignore[arg-type]


def test_publish_bind_failure_raises(make_indexer: Any, short_dir: Path) -> None:
    """A bind failure is an ATTACH error: the constructor raises KvshmError naming the endpoint."""
    blocker = short_dir / "notadir"
    blocker.write_text("")
    with pytest.raises(kvshm.KvshmError, match="notadir"):
        make_indexer(publish=ZmqPublish(endpoint=f"ipc://{blocker}/pub.sock"))


def test_apply_batch_without_publish(make_indexer: Any) -> None:
    """Batches go through the ring as BATCH records with or without ZMQ; the index numbers them by seq."""
    ix = make_indexer()
    assert ix.stats()["publishing"] is False
    ix.apply_batch(10, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None),
                        ke.BlockStored([2], 1, [5, 6, 7, 8], 4, None, "GPU", None)])
    ix.apply_batch(11, [])  # nothing published
    ix.apply_batch(12, [ke.BlockRemoved([2], None)])
    assert event_ids(query(ix, 10)) == [10, 10, 12]
    with pytest.raises(TypeError, match="not dict"):
        ix.apply_batch(13, [{"type": "BlockStored"}])
    with pytest.raises(TypeError):
        ix.apply_batch(13, "BlockStored")
    with pytest.raises(TypeError):
        ix.apply_batch(13, [ke.AllBlocksCleared()], ts="now")
    with pytest.raises(ValueError):
        ix.apply_batch(-1, [ke.AllBlocksCleared()])
    assert ix.stats()["batch"]["batches"] == 2


def test_batch_larger_than_a_record_is_a_loss(make_indexer: Any) -> None:
    ix = make_indexer(ring_bytes=64 << 10)  # max_record 8 KiB
    big = [ke.BlockStored([i], None, [0] * 4, 4, None, "GPU", None) for i in range(200)]
    ix.apply_batch(1, big)
    ix.apply_batch(2, [ke.AllBlocksCleared()])
    st = ix.stats()
    assert st["batch"]["records_dropped"] == 1 and st["batch"]["records"] == 1
    assert st["dropped_events"] == 1
    wait_for(lambda: ix.stats()["lost_ranges"] is not None and ix.stats()["lost_ranges"] != [],
             "the daemon to report the lost seq")
    lost = ix.stats()["lost_ranges"]
    assert lost[0]["first"] == 1 and lost[0]["last"] == 1, lost


def test_fallback_without_batches(make_indexer: Any) -> None:
    """Against a daemon whose ATTACH reply lacks "batches" (an older kvshmd; simulated by clearing the flag the
    indexer keeps from the real reply), each indexable event is published as an EVENT record with the batch's seq,
    non-device events are skipped, metadata is dropped, all counted."""
    ix = make_indexer()
    core = ix._core
    core.batches_ok = False
    ix.apply_batch(5, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None),
                       ke.BlockStored([9], None, [1, 2, 3, 4], 4, None, "CPU", None),
                       ke.BlockRemoved([7], None)])
    st = ix.stats()["batch"]
    assert st["fallback_batches"] == 1 and st["records"] == 0
    assert st["fallback_not_indexed"] == 1 and st["fallback_meta_dropped"] == 2
    assert ix.stats()["published_events"] == 2
    resp = query(ix, 5)
    assert variant(resp) == "Events" and event_ids(resp) == [5]  # this daemon takes the 2nd id 5 as a reset


def test_events_never_start_inside_an_evicted_batch(make_indexer: Any) -> None:
    """The judge's repro (conformance, batch-tiny-buffer): a log of 4 events evicts batch 0 (3 events) whole when
    batches 1 and 2 arrive, so a query from 0 is a TreeDump, never a suffix of batch 0."""
    ix = make_indexer(7, 2, 4)
    ix.apply_batch(0, [ke.BlockStored([1], None, [1, 1], 2, None, "GPU", None),
                       ke.BlockStored([2], 1, [2, 2], 2, None, "GPU", None),
                       ke.BlockStored([3], 2, [3, 3], 2, None, "GPU", None)])
    ix.apply_batch(1, [ke.BlockRemoved([3], "GPU")])
    ix.apply_batch(2, [ke.BlockStored([4], None, [4, 4], 2, None, "GPU", None)])
    assert variant(query(ix, 0)) == "TreeDump"
    assert event_ids(query(ix, 1)) == [1, 2]


def test_publishing_survives_a_daemon_restart(make_indexer: Any, short_dir: Path) -> None:
    """SIGKILL of the private kvshmd while publishing: its successor binds the same endpoints again (the producer's
    re-ATTACH carries publish=), the subscriber's wire seqs go on above every seq the dead daemon published (the
    successor starts at unix µs, docs/lifecycle.md: nothing reused), and the replay socket holds only what the successor
    published, then the end marker (README, "Failure behaviour")."""
    endpoint = f"ipc://{short_dir}/pub.sock"
    replay = f"ipc://{short_dir}/replay.sock"
    ix = make_indexer(publish=ZmqPublish(endpoint=endpoint, replay_endpoint=replay))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    try:
        wire, seq = join(ix, sub)
        ix.apply_batch(seq, [ke.BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None)], ts=2.0)
        _, wire, payload = recv_batch(sub, wire)
        assert payload == vllm_payload(2.0, [BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None)], 0)
        wait_for(lambda: ix.stats(daemon=False)["ring"]["head"] > 0, "the periodic checkpoint")
        pid = ix.stats()["daemon_pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: (st := ix.stats(daemon=False))["attached"] and st["attaches"] == 2, "the restart")
        assert ix.stats()["publishing"] is True
        # The same SUB socket reconnects by itself (libzmq); warm up again from the next seq.
        got, _ = warm_up(lambda s, ts: ix.apply_batch(s, [ke.AllBlocksCleared()], ts=ts), sub, seq + 1)
        assert got > wire  # never a reused seq
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10_000)
        dealer.connect(replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs = []
        while True:
            frames = dealer.recv_multipart()
            if frames[-1] == b"":
                assert frames[-2] == b"\xff" * 8
                break
            seqs.append(int.from_bytes(frames[-2], "big"))
        dealer.close(0)
        assert seqs and min(seqs) > wire, (seqs, wire)  # only the successor's batches
        assert seqs == sorted(set(seqs)) and got in seqs
    finally:
        sub.close(0)
        ctx.term()


def test_engine_restarted_on_the_same_worker(shared_daemon: SharedDaemon, make_indexer: Any, short_dir: Path) -> None:
    """docs/lifecycle.md, an engine restarted on the same worker, through a shared kvshmd: the subscriber sees the dead
    incarnation's batch, its end Cleared, the new one's start Cleared and batch, under strictly increasing wire
    seqs; a replay from the old incarnation's end holds only the new incarnation (its start Cleared first), one from 0
    only its batch; the index only its blocks.

    An engine that restarts within --zmq-replay-fill µs (the wire seqs start above the clock in µs) makes the reply
    from the end contiguous: the wiped incarnation's seqs and any heartbeats' go as empty batches. So each reply is
    judged by what is guaranteed either way (docs/replay-snapshots.md, "Contiguous replies"): strictly increasing
    seqs from the requested one, empty batches only in a reply that carries every seq from it, and the batches with
    events exactly the expected ones, byte for byte."""
    endpoint, replay = f"ipc://{short_dir}/pub.sock", f"ipc://{short_dir}/replay.sock"
    publish = ZmqPublish(endpoint=endpoint, replay_endpoint=replay)
    stored = [BlockStored([h], None, [h] * 4, 4, None, "GPU", None) for h in (1, 2)]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = sub_socket(ctx, endpoint)
    try:
        a = make_indexer(worker_id=9, socket_path=shared_daemon.socket_path, publish=publish)
        wire, seq = join(a, sub)
        a.apply_batch(seq, [stored[0]], ts=2.0)
        _, wire, payload = recv_batch(sub, wire)
        assert payload == vllm_payload(2.0, [stored[0]], 0)
        a.shutdown()  # the end of its incarnation
        _, end, payload = recv_batch(sub, wire)
        assert payload == vllm_payload(decode(payload)[0], [AllBlocksCleared()], 0), decode(payload)
        b = make_indexer(worker_id=9, socket_path=shared_daemon.socket_path, publish=publish)
        _, start, cleared = recv_batch(sub, end)  # the SUB stays connected: the endpoint is the same stream's
        assert cleared == vllm_payload(decode(cleared)[0], [AllBlocksCleared()], 0), decode(cleared)
        b.apply_batch(0, [stored[1]], ts=3.0)  # the new engine's seq starts at 0 again
        _, last, payload = recv_batch(sub, start)
        assert payload == vllm_payload(3.0, [stored[1]], 0)
        def replay_from(seq: int) -> list[tuple[int, bytes]]:
            """The reply to a replay request from seq, checked for what every reply guarantees; returns its batches
            with events."""
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.RCVTIMEO, 10_000)
            dealer.connect(replay)
            dealer.send_multipart([b"", seq.to_bytes(8, "big")])
            got = []
            while (frames := dealer.recv_multipart())[-1] != b"":
                got.append((int.from_bytes(frames[-2], "big"), frames[-1]))
            dealer.close(0)
            seqs = [s for s, _ in got]
            assert seqs and seqs[0] >= seq and all(a < b for a, b in zip(seqs, seqs[1:])), (seq, seqs)
            if any(is_heartbeat(p) for _, p in got):  # a filled reply: every seq from the requested one
                assert seqs == list(range(seq, seqs[-1] + 1)), (seq, seqs[:3], seqs[-3:], len(seqs))
            return [(s, p) for s, p in got if not is_heartbeat(p)]

        # A router that held the old incarnation gets the new one from its start Cleared; one that holds nothing
        # (from seq 0) gets no Cleared to apply (docs/replay-snapshots.md, "A reply from seq 0").
        assert replay_from(end) == [(start, cleared), (last, payload)]
        assert replay_from(0) == [(last, payload)]
        assert query(b, start)["Events"]["last_event_id"] == last
        assert {blk["block_hash"] for e in query(b)["TreeDump"]["events"]
                for blk in e["event"]["data"]["stored"]["blocks"]} == {2}
    finally:
        sub.close(0)
        ctx.term()
