"""kvshm.integrations.sglang without SGLang: SGLang-shaped event objects (its 0.5.23 field names, signed int64 block
hashes) through the plugin, kvshmd's ZMQ stream byte-identical to the payloads SGLang's own structs wrote
(testdata/vllmwire/vectors_sglang.json, written by gen_sglang_vectors.py in SGLang's venv); the configuration
decided at construction (page size, endpoints). The same plugin inside the real SGLang, against SGLang's own
ZmqEventPublisher, is pybind/sglang_test (make sglang-plugin-test)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq
from vllm_shapes import recv_batch, warm_up

from kvshm.integrations.sglang import KvshmSGLangPublisher, kvshm_endpoint

VECTORS = Path(__file__).resolve().parents[2] / "testdata" / "vllmwire" / "vectors_sglang.json"
sys.path.insert(0, str(VECTORS.parent))
# SGLang 0.5.23's event structs (msgspec, as SGLang's own): the objects SGLang hands its publisher.
from sglang_structs import AllBlocksCleared, BlockRemoved, BlockStored, signed  # noqa: E402


@dataclass
class KVEventBatch:  # SGLang's batch as the plugin reads it: the rank is attn_dp_rank
    ts: float
    events: list[Any] = field(default_factory=list)
    attn_dp_rank: int | None = None


def sglang_event(v: dict[str, Any]) -> Any:
    if v["kind"] == "cleared":
        return AllBlocksCleared()
    hashes = [signed(h) for h in v["block_hashes"]]
    if v["kind"] == "removed":
        return BlockRemoved(hashes, v["medium"])
    toks = v["token_ids"]
    if v["is_eagle"]:
        toks = [(toks[i], toks[i + 1]) for i in range(len(toks) - 1)]
    parent = None if v["parent"] is None else signed(v["parent"])
    return BlockStored(hashes, parent, toks, v["block_size"], v["lora_id"], v["medium"], v["cache_salt"],
                       v["session_id"], v["lora_name"])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, ring_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_RING_DIR", str(ring_dir))
    monkeypatch.setenv("KVSHM_RING_BYTES", str(1 << 20))
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    monkeypatch.setenv("KVSHM_WORKER_ID", "7")


def test_stream_matches_sglang_vectors(env: None, short_dir: Path) -> None:
    """Every SGLang vector of dp rank 0 published through the plugin comes out of kvshmd as SGLang's own bytes."""
    vectors = [v for v in json.loads(VECTORS.read_text())["vectors"] if v["dp_rank"] == 0 and v["ts"] and v["events"]]
    assert len(vectors) >= 10
    endpoint = f"ipc://{short_dir}/pub.sock"
    pub = KvshmSGLangPublisher(attn_dp_rank=0, endpoint=endpoint, topic="kv", bind=None)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        mark, _ = warm_up(lambda s, ts: pub.publish(KVEventBatch(ts, [AllBlocksCleared()])), sub)
        for v in vectors:
            pub.publish(KVEventBatch(v["ts"], [sglang_event(e) for e in v["events"]]))  # attn_dp_rank None: 0
            topic, mark, payload = recv_batch(sub, mark)
            assert topic == b"kv" and payload.hex() == v["payload_hex"], v["name"]
        assert pub.errors == 0
    finally:
        pub.shutdown()
        sub.close(0)
        ctx.term()


@pytest.mark.parametrize("endpoint,bind,want", [
    ("tcp://*:5557", None, "tcp://*:5557"),
    ("tcp://0.0.0.0:5557", None, "tcp://*:5557"),  # SGLang binds it: every IPv4 interface, kvshmd's "*"
    ("tcp://[::]:5557", None, "tcp://[::]:5557"),
    ("ipc:///tmp/x.sock", True, "ipc:///tmp/x.sock"),
    ("tcp://10.0.0.1:5557", None, "tcp://10.0.0.1:5557"),  # connected by both
    ("tcp://10.0.0.1:5557", False, "tcp://10.0.0.1:5557"),
    ("tcp://127.0.0.1:5557", True, None),  # SGLang would bind a concrete address: kvshmd cannot
    ("tcp://*:5557", False, None),
    ("inproc://cache", None, None),
])
def test_endpoint_rules(endpoint: str, bind: bool | None, want: str | None) -> None:
    if want is None:
        with pytest.raises(ValueError):
            kvshm_endpoint(endpoint, bind)
    else:
        assert kvshm_endpoint(endpoint, bind) == want


def test_page_size_required(env: None, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    """No KVSHM_KV_BLOCK_SIZE, no SGLang server arguments, no tree_cache in the caller: a configuration error at
    construction, naming the variable."""
    monkeypatch.delenv("KVSHM_KV_BLOCK_SIZE")
    with pytest.raises(ValueError, match="KVSHM_KV_BLOCK_SIZE"):
        KvshmSGLangPublisher(endpoint=f"ipc://{short_dir}/p.sock")


def test_page_size_from_tree_cache(env: None, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    monkeypatch.delenv("KVSHM_KV_BLOCK_SIZE")

    endpoint = f"ipc://{short_dir}/p.sock"

    class Holder:  # SGLang's SchedulerKvEventsPublisher: self.tree_cache set before the publisher is built
        def __init__(self) -> None:
            self.tree_cache = type("TreeCache", (), {"page_size": 16})()
            self.pub = KvshmSGLangPublisher(attn_dp_rank=0, endpoint=endpoint, replay_endpoint=None)

    pub = Holder().pub
    try:
        assert pub.kv_block_size == 16 and pub.describe_local_source(16) == {
            "dp_rank": 0, "endpoint": endpoint, "topic": "", "block_size": 16}
        pub.publish(KVEventBatch(1.0, [object()]))  # not an event: dropped and counted, never raised
        assert pub.errors == 1 and pub.last_error
    finally:
        pub.shutdown()


def test_entry_point_declared() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "kvshm"]
    if not eps:
        pytest.skip("kvshm is not installed as a distribution here (PYTHONPATH run)")
    assert eps[0].value == "kvshm.integrations.sglang:register"


def test_sglang_structs_match_sglang() -> None:
    """testdata/vllmwire/sglang_structs.py (SGLang's shape for venvs without SGLang, the events above) encodes every
    SGLang vector to the bytes SGLang's own structs wrote."""
    import msgspec
    import sglang_structs as ss

    enc = msgspec.msgpack.Encoder()
    for v in json.loads(VECTORS.read_text())["vectors"]:
        batch = ss.KVEventBatch(ts=v["ts"], events=[sglang_event(e) for e in v["events"]], attn_dp_rank=v["dp_rank"])
        assert enc.encode(batch).hex() == v["payload_hex"], v["name"]
