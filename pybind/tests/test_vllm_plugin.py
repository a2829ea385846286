"""kvshm.integrations.vllm with kvshm.events objects (no vLLM needed): everything decided at construction (the block
size from vLLM's config, the indexer, the bound PUB, the wire), the ZMQ stream byte-identical to vLLM's encoding,
publish() never raising into the scheduler. The same publisher
driven by the real vLLM 0.33.0 (register(), KVEventsConfig(publisher="kvshm"), EventPublisherFactory) is
tests/vllm_real/test_vllm_real.py (make vllm-plugin-test)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq
from vllm_shapes import BlockRemoved, BlockStored, first_id, recv_batch, vllm_payload, warm_up

from kvshm import KvshmError, LocalIndexer
from kvshm import events as ke
from kvshm.integrations.vllm import KvshmEventPublisher

from helpers import event_ids, query


@dataclass
class Batch:  # vLLM's KVEventBatch's attributes
    ts: float
    events: list[Any] = field(default_factory=list)
    data_parallel_rank: int | None = None


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, ring_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_RING_DIR", str(ring_dir))
    monkeypatch.setenv("KVSHM_RING_BYTES", str(1 << 20))
    monkeypatch.delenv("KVSHM_KV_BLOCK_SIZE", raising=False)
    monkeypatch.setenv("KVSHM_WORKER_ID", "42")


def indexer_of(pub: KvshmEventPublisher) -> LocalIndexer | None:
    return pub.indexer  # a call: mypy must not carry a narrowing of the property across publish()


def stored(h: int, bs: int = 4, medium: str | None = "GPU") -> ke.BlockStored:
    return ke.BlockStored([h], None, [h] * bs, bs, None, medium, None)


def test_publisher_streams_from_construction(env: None, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    """The block size comes from the environment here (no vLLM config): the indexer exists and the PUB is bound
    when the constructor returns, so a subscriber connected then gets the first batch; vLLM's seq rule (empty
    batches take none), the framing and the bytes."""
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    endpoint = f"ipc://{short_dir}/pub.sock"
    pub = KvshmEventPublisher(data_parallel_rank=0, endpoint=endpoint, topic="t", max_queue_size=2, extra_field=1)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        ix = indexer_of(pub)
        assert ix is not None and ix.stats(daemon=False)["worker_id"] == 42 and pub.kv_block_size == 4
        assert (short_dir / "pub.sock").exists(), "the PUB is not bound at construction"
        pub.publish(Batch(1.0, [ke.BlockRemoved([1], "GPU")]))  # engine seq 0
        pub.publish(Batch(2.0, []))  # empty: ignored, takes no seq
        pub.publish(Batch(3.0, [ke.AllBlocksCleared()]))  # engine seq 1
        pub.publish(Batch(5.0, [stored(7)]))  # engine seq 2
        # Under kvshmd's wire seqs (docs/lifecycle.md): the incarnation's start Cleared, then the three batches.
        resp = query(ix, first_id(ix))
        ids = event_ids(resp)
        assert len(ids) == 4 and ids == sorted(set(ids)), ids
        kinds = [d if isinstance(d := e["event"]["data"], str) else next(iter(d)) for e in resp["Events"]["events"]]
        assert kinds == ["cleared", "removed", "cleared", "stored"], resp
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        # Keep publishing until the subscriber is joined, then check the framing and bytes.
        mark, _ = warm_up(lambda s, ts: pub.publish(Batch(ts, [stored(100 + s)])), sub, 3)
        pub.publish(Batch(7.5, [stored(9, medium=None), ke.BlockRemoved([7], "GPU")], data_parallel_rank=0))
        topic, _, payload = recv_batch(sub, mark)
        assert topic == b"t"
        assert payload == vllm_payload(7.5, [BlockStored([9], None, [9] * 4, 4, None, None, None),
                                             BlockRemoved([7], "GPU")], 0)
        assert pub.errors == 0 and pub.get_publisher_config() is None  # no vLLM installed here
    finally:
        pub.shutdown()
        sub.close(0)
        ctx.term()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish(Batch(8.0, [stored(1)]))
    pub.shutdown()  # idempotent


# -- the block size from vLLM's own config -------------------------------------------------------------------------
@dataclass
class CacheConfig:
    block_size: int


@dataclass
class ParallelConfig:
    decode_context_parallel_size: int = 1


@dataclass
class VllmConfig:  # the attributes the plugin reads of vLLM's VllmConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)


class Factory:  # vLLM's EventPublisherFactory.create: KVEventsConfig's fields as keyword arguments
    @staticmethod
    def create(fields: dict[str, Any], data_parallel_rank: int = 0) -> KvshmEventPublisher:
        return KvshmEventPublisher(data_parallel_rank=data_parallel_rank, **fields)


class Scheduler:  # vLLM's Scheduler.__init__: self.vllm_config is set before the publisher is created
    def __init__(self, vllm_config: VllmConfig, fields: dict[str, Any]) -> None:
        self.vllm_config = vllm_config
        self.kv_event_publisher = Factory.create(fields, 0)


def test_block_size_from_the_schedulers_config(env: None, short_dir: Path) -> None:
    """No KVSHM_KV_BLOCK_SIZE: the block size is vLLM's cache_config.block_size, read from the scheduler that
    constructs the publisher (fails before: the block size waited for the first BlockStored)."""
    s = Scheduler(VllmConfig(CacheConfig(16)), {"endpoint": f"ipc://{short_dir}/p.sock"})
    pub = s.kv_event_publisher
    try:
        ix = indexer_of(pub)
        assert ix is not None and pub.kv_block_size == 16 and ix.stats(daemon=False)["kv_block_size"] == 16
        # A first event of another KV cache group (block size 8) does not change it.
        pub.publish(Batch(1.0, [ke.BlockStored([5], None, list(range(8)), 8, None, "GPU", None)]))
        assert pub.kv_block_size == 16 and pub.errors == 0
    finally:
        pub.shutdown()


@pytest.mark.parametrize("how", ["argument", "current config", "decode context parallel"])
def test_block_size_other_sources(env: None, short_dir: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    ep = f"ipc://{short_dir}/p.sock"
    if how == "argument":
        pub = KvshmEventPublisher(endpoint=ep, vllm_config=VllmConfig(CacheConfig(48)))
        want = 48
    elif how == "current config":
        cfg = VllmConfig(CacheConfig(64))
        monkeypatch.setitem(sys.modules, "vllm.config", SimpleNamespace(get_current_vllm_config_or_none=lambda: cfg))
        pub = KvshmEventPublisher(endpoint=ep)
        want = 64
    else:
        pub = Scheduler(VllmConfig(CacheConfig(16), ParallelConfig(2)), {"endpoint": ep}).kv_event_publisher
        want = 32
    try:
        assert pub.kv_block_size == want
    finally:
        pub.shutdown()


def test_env_block_size_wins_over_config(env: None, short_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "8")
    with caplog.at_level(logging.WARNING, logger="kvshm.vllm"):
        pub = Scheduler(VllmConfig(CacheConfig(16)), {"endpoint": f"ipc://{short_dir}/p.sock"}).kv_event_publisher
    try:
        assert pub.kv_block_size == 8 and "overrides vLLM's block size 16" in caplog.text
    finally:
        pub.shutdown()


def test_no_block_size_is_refused_at_construction(env: None, short_dir: Path) -> None:
    """Neither the environment nor a vLLM config: the engine must not start with a guessed block size (fails
    before: the publisher started and guessed from the first BlockStored)."""
    with pytest.raises(ValueError, match="KVSHM_KV_BLOCK_SIZE"):
        KvshmEventPublisher(endpoint=f"ipc://{short_dir}/p.sock")
    assert not (short_dir / "p.sock").exists()


def test_bind_error_raised_at_construction(env: None, short_dir: Path) -> None:
    """An endpoint kvshmd cannot bind fails the constructor (vLLM raises its own publisher's bind errors there),
    never a publish (fails before: the LocalIndexer, and so the bind, came with the first BlockStored, inside
    publish())."""
    with pytest.raises(KvshmError, match="nowhere/p.sock"):
        Scheduler(VllmConfig(CacheConfig(16)), {"endpoint": f"ipc://{short_dir}/nowhere/p.sock"})


# -- publish never raises into the scheduler -----------------------------------------------------------------------
class BlockStoredV0:  # an older vLLM's BlockStored: no lora_name, medium, extra_keys...
    def __init__(self, h: int) -> None:
        self.block_hashes = [h]
        self.parent_block_hash = None
        self.token_ids = [h] * 4
        self.block_size = 4
        self.lora_id = None


BlockStoredV0.__name__ = "BlockStored"


class KvshmBug(Exception):
    pass


def _raise_bug(*args: Any, **kw: Any) -> None:
    raise KvshmBug("apply_batch broke")


BAD_PATHS: list[tuple[str, Any]] = [
    ("not an event", Batch(1.0, [object()])),
    ("an older vLLM's event (AttributeError)", Batch(1.0, [BlockStoredV0(3)])),
    ("not a batch", None),
    ("a batch without ts", SimpleNamespace(events=[ke.AllBlocksCleared()])),
    ("a bad ts", Batch("later", [ke.AllBlocksCleared()])),  # type: ignore[arg-type]
    ("a bad dp rank", Batch(1.0, [ke.AllBlocksCleared()], data_parallel_rank=7)),
    ("a kvshm bug", "bug"),
    ("a closed LocalIndexer", "closed"),
]


@pytest.mark.parametrize("what,batch", BAD_PATHS, ids=[w for w, _ in BAD_PATHS])
def test_publish_never_raises(env: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                              short_dir: Path, what: str, batch: Any) -> None:
    """Every failure inside publish() is logged, counted and dropped; the next good batch is published (fails
    before for everything but TypeError/ValueError: AttributeError, a kvshm bug, a closed indexer)."""
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    pub = KvshmEventPublisher(endpoint=f"ipc://{short_dir}/p.sock")
    ix = indexer_of(pub)
    assert ix is not None
    try:
        if batch == "bug":
            monkeypatch.setattr(LocalIndexer, "apply_batch", _raise_bug)
            batch = Batch(1.0, [stored(1)])
        elif batch == "closed":
            ix.shutdown()
            batch = Batch(1.0, [stored(1)])
        with caplog.at_level(logging.ERROR, logger="kvshm.vllm"):
            pub.publish(batch)
        assert pub.errors == 1 and pub.last_error and "not published" in caplog.text, (pub.last_error, caplog.text)
        if what not in ("a kvshm bug", "a closed LocalIndexer"):
            pub.publish(Batch(2.0, [stored(3)]))
            assert pub.errors == 1
            assert len(event_ids(query(ix, 0))) == 1
    finally:
        pub.shutdown()
    with pytest.raises(RuntimeError, match="closed"):  # vLLM's publisher says so too
        pub.publish(Batch(3.0, [stored(1)]))


def test_publish_errors_are_rate_limited(env: None, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture, short_dir: Path) -> None:
    import kvshm.integrations._publisher as plugin  # the rate limit is the shared publisher's

    now = [1000.0]
    monkeypatch.setattr(plugin, "_clock", lambda: now[0])
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    pub = KvshmEventPublisher(endpoint=f"ipc://{short_dir}/p.sock")
    try:
        with caplog.at_level(logging.ERROR, logger="kvshm.vllm"):
            for _ in range(5):
                pub.publish(Batch(1.0, [object()]))
            assert pub.errors == 5 and caplog.text.count("not published") == 1
            now[0] += plugin._LOG_INTERVAL
            pub.publish(Batch(1.0, [object()]))
        assert caplog.text.count("not published") == 2 and "4 more dropped" in caplog.text
    finally:
        pub.shutdown()


def test_shutdown_never_raises(env: None, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    pub = KvshmEventPublisher(endpoint=f"ipc://{short_dir}/p.sock")
    ix = indexer_of(pub)
    assert ix is not None
    real = LocalIndexer.shutdown
    monkeypatch.setattr(LocalIndexer, "shutdown", _raise_bug)
    pub.shutdown()
    real(ix)


# -- the wire of the installed vLLM --------------------------------------------------------------------------------
@pytest.mark.parametrize("ver,want", [
    ("0.32.0", "0.32"), ("0.32.1+cpu", "0.32"), ("0.31.0", "0.31"), ("0.31.2+cpu", "0.31"),
    ("0.11.2", "0.32"), ("0.33.0", "0.33"), ("0.33.1rc1", "0.33"),
    ("0.40.0.dev3", "0.33"), ("1.0.0", "0.33"), (None, None), ("", None), ("dev", None), ("7", None),
])
def test_vllm_wire(ver: str | None, want: str | None) -> None:
    from kvshm.integrations.vllm import vllm_wire

    assert vllm_wire(ver) == want


@pytest.mark.parametrize("has_wire", [True, False])
def test_wire_passed_when_zmqpublish_has_it(env: None, monkeypatch: pytest.MonkeyPatch, has_wire: bool) -> None:
    """vLLM 0.32.0 installed: ZmqPublish(wire="0.32") when kvshm's ZmqPublish has the field; without it, the
    default wire and a warning (the lead merges the two branches)."""
    import dataclasses

    import kvshm.integrations.vllm as plugin

    @dataclasses.dataclass
    class WithWire:
        endpoint: str = ""
        wire: str = "0.33"

    @dataclasses.dataclass
    class WithoutWire:
        endpoint: str = ""

    monkeypatch.setattr(plugin, "ZmqPublish", WithWire if has_wire else WithoutWire)
    got = [dataclasses.asdict(plugin._zmq_publish(w, endpoint="x")) for w in ("0.32", None)]
    assert got == [{"endpoint": "x", "wire": "0.32"}, {"endpoint": "x", "wire": "0.33"}] if has_wire else \
        [{"endpoint": "x"}, {"endpoint": "x"}]
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    assert plugin.vllm_wire(plugin.vllm_version()) == "0.32"


def test_env_wire_wins(env: None, monkeypatch: pytest.MonkeyPatch, short_dir: Path) -> None:
    """KVSHM_WIRE picks the layout whatever vLLM is installed (llm-d decodes only "array"); an unknown one stops
    the engine at construction with its message."""
    monkeypatch.setenv("KVSHM_KV_BLOCK_SIZE", "4")
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.33.0"))
    monkeypatch.setenv("KVSHM_WIRE", "array")
    pub = KvshmEventPublisher(endpoint=f"ipc://{short_dir}/pub.sock")
    try:
        assert pub.wire == "array" and pub._publish.wire == "array"  # noqa: SLF001 - what the daemon was given
    finally:
        pub.shutdown()
    monkeypatch.setenv("KVSHM_WIRE", "0.1")
    with pytest.raises(ValueError, match="wire '0.1'"):
        KvshmEventPublisher(endpoint=f"ipc://{short_dir}/pub2.sock")


def test_env_validation(env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHM_WORKER_ID", "x")
    with pytest.raises(ValueError, match="KVSHM_WORKER_ID"):
        KvshmEventPublisher()


def test_entry_point_declared() -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kvshm"]
    if not eps:
        pytest.skip("kvshm is not installed as a distribution here (PYTHONPATH run)")
    assert eps[0].value == "kvshm.integrations.vllm:register"


@pytest.mark.parametrize("name", ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
def test_kvshm_events_mirror_vllm_structs(name: str) -> None:
    """kvshm.events (no msgspec) and the reference vLLM 0.33.0 Structs (testdata/vllmwire/vllm_structs.py) agree:
    the same field names in the same order with the same defaults, so positional construction means the same."""
    import dataclasses

    import vllm_shapes

    ours = getattr(ke, name)
    ref = getattr(vllm_shapes, name)
    fields = dataclasses.fields(ours)
    assert tuple(f.name for f in fields) == ref.__struct_fields__
    required = len(ref.__struct_fields__) - len(ref.__struct_defaults__)
    assert [f.default for f in fields[required:]] == list(ref.__struct_defaults__)
    assert all(f.default is dataclasses.MISSING for f in fields[:required])
