"""kvshm's vLLM plugin against the real vLLM, 0.33.0, 0.32.0 or 0.31.0 (make vllm-plugin-test
[VLLM_VERSION=0.32.0|0.31.0]: a venv with vLLM and torch; no GPU needed: only vLLM's config and KV-event modules run).

vLLM's plugin loader runs the `vllm.general_plugins` entry point of the installed kvshm wheel; the test then builds
`KVEventsConfig(publisher="kvshm", ...)` (refused by vLLM without the plugin), creates the publisher through
`EventPublisherFactory.create` as vLLM's scheduler does, and publishes real `KVEventBatch` objects. The judge is
vLLM's own `ZmqEventPublisher`, fed the same batches side by side: every payload a pyzmq subscriber receives live,
and every replay frame, must be byte-identical to vLLM's for the installed release (its BlockStored differs between
0.32.0 and 0.33.0), with bytes block hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) among them. The release's
shared vectors (testdata/vllmwire, which vllmwire's Go tests pin byte for byte) must be what the installed vLLM's own
structs and msgspec write.

The comparison (seqs are kvshmd's: by payload and order) is pybind/enginetest/wirecheck.py, shared with the SGLang
plugin's test. The recovery index holds the events under the seqs they went out with.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "enginetest"))
import wirecheck  # noqa: E402

VECTORS = Path(__file__).resolve().parents[2] / "testdata" / "vllmwire"
sys.path.insert(0, str(VECTORS))
from gen_vectors import FILES, vectors  # noqa: E402

kv_events = pytest.importorskip("vllm.distributed.kv_events")
import vllm  # noqa: E402
from vllm.config.kv_events import KVEventsConfig  # noqa: E402
from vllm.distributed.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisher,
    EventPublisherFactory,
    KVEventBatch,
    ZmqEventPublisher,
)

from kvshm import LocalIndexer  # noqa: E402
from kvshm.integrations.vllm import KvshmEventPublisher  # noqa: E402

# The kvshm wire name of the installed release (ZmqPublish(wire=...)).
WIRE = ".".join(vllm.__version__.split(".")[:2])


def test_installed_release_is_known() -> None:
    assert WIRE in ("0.31", "0.32", "0.33"), f"vLLM {vllm.__version__}: kvshm knows the wire of 0.31, 0.32, 0.33"
    site = os.environ.get("KVSHM_VLLM_TEST_SITE")  # make vllm-plugin-test: the wheel under test, not the venv's
    if site:
        import kvshm

        assert Path(kvshm.__file__).resolve().is_relative_to(Path(site).resolve()), kvshm.__file__


def test_vectors_are_the_installed_vllms() -> None:
    """The committed vectors of the installed release (written by gen_vectors.py from vllm_structs.py's mirror of
    its structs) are byte for byte what vLLM's own KVEventBatch and event classes and msgspec write for the same
    cases."""
    committed = json.loads((VECTORS / FILES[WIRE]).read_text(encoding="utf-8"))["vectors"]
    own = vectors(WIRE, (BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch))
    assert len(own) == len(committed) > 20
    for mine, theirs in zip(own, committed, strict=True):
        assert mine["name"] == theirs["name"]
        assert mine["payload_hex"] == theirs["payload_hex"], mine["name"]


def batches() -> list[Any]:
    """The test batches, new objects each call (publish() fills in the dp rank). Fixed ts, so vLLM's and kvshm's
    payloads of a batch are comparable byte for byte."""
    sha = [bytes([i]) * 24 + (1000 + i).to_bytes(8, "big") for i in range(4)]  # sha256-sized bytes hashes
    return [
        KVEventBatch(ts=1700000001.25, events=[
            BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=list(range(8)), block_size=4,
                        lora_id=None, medium="GPU", lora_name=None),
        ]),
        KVEventBatch(ts=1700000002.5, events=[
            BlockStored(block_hashes=[13], parent_block_hash=12, token_ids=[8, 9, 10, 11], block_size=4,
                        lora_id=None, medium="GPU", lora_name=None, extra_keys=[("salt",)], group_idx=0,
                        kv_cache_spec_kind="full_attention"),
            BlockRemoved(block_hashes=[13], medium="GPU"),
            BlockStored(block_hashes=[99], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4,
                        lora_id=3, medium="CPU", lora_name="lora-a"),
            BlockStored(block_hashes=[2**64 - 1], parent_block_hash=None, token_ids=[5, 6, 7, 8], block_size=4,
                        lora_id=None, medium=None, lora_name=None, group_idx=1, kv_cache_spec_kind="sliding_window",
                        kv_cache_spec_sliding_window=128),
        ]),
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the hashes go out as bytes.
        KVEventBatch(ts=1700000003.75, events=[
            BlockStored(block_hashes=sha[1:3], parent_block_hash=sha[0], token_ids=list(range(8)), block_size=4,
                        lora_id=None, medium="GPU", lora_name=None),
            BlockRemoved(block_hashes=[sha[2]], medium="GPU"),
        ]),
        KVEventBatch(ts=1700000004.0, events=[AllBlocksCleared()]),
    ]


VLLM = wirecheck.Engine(
    batches=batches,
    cleared=lambda ts: KVEventBatch(ts=ts, events=[AllBlocksCleared()]),
    marker_payload=msgspec.msgpack.encode(KVEventBatch(ts=wirecheck.MARKER_TS, events=[AllBlocksCleared()],
                                                       data_parallel_rank=0)),
    reference=lambda ep, rep: ZmqEventPublisher(data_parallel_rank=0, endpoint=ep, replay_endpoint=rep, topic="kv"),
)


def check_against_reference(publish: Callable[[Any], object], ix: Callable[[], LocalIndexer | None], d: Path,
                            endpoint: str, replay_endpoint: str) -> None:
    got = wirecheck.check_against_reference(VLLM, publish, d, endpoint, replay_endpoint)
    # The recovery index: each batch's device events under the seq it went out with (the device-tree filter: the CPU
    # event and the sliding-window group are not indexed).
    indexer = ix()
    assert indexer is not None
    resp = json.loads(indexer.get_events_json(got[0][0]))
    ids = [e["event"]["event_id"] for e in resp["Events"]["events"]]
    s = [seq for seq, _ in got]
    assert ids == [s[0], s[1], s[1], s[2], s[2], s[3]], (ids, s)


@pytest.fixture
def ring_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    return wirecheck.plugin_env(monkeypatch, "VLLM_PLUGINS")


def test_kvshm_publisher_in_real_vllm(ring_dir: Path) -> None:
    """The plugin through vLLM's own loader and factory: byte-identical to vLLM's ZmqEventPublisher."""
    d = ring_dir
    cfg_fields: dict[str, Any] = {
        "enable_kv_cache_events": True, "publisher": "kvshm", "endpoint": f"ipc://{d}/pub.sock",
        "replay_endpoint": f"ipc://{d}/replay.sock", "topic": "kv",
    }
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader runs kvshm's entry point
    cfg = KVEventsConfig(**cfg_fields)
    assert cfg.publisher == "kvshm"
    pub = EventPublisherFactory.create(cfg, data_parallel_rank=0)
    assert isinstance(pub, KvshmEventPublisher) and isinstance(pub, EventPublisher)
    assert pub.wire == WIRE, "the plugin picks the installed release's wire"
    try:
        check_against_reference(pub.publish, lambda: pub.indexer, d, cfg_fields["endpoint"],
                                cfg_fields["replay_endpoint"])
        got_cfg = pub.get_publisher_config()
        assert got_cfg.publisher == "kvshm" and got_cfg.endpoint == cfg_fields["endpoint"]
    finally:
        pub.shutdown()


def test_apply_batch_matches_installed_vllm(ring_dir: Path) -> None:
    """LocalIndexer(publish=ZmqPublish(wire=<the installed release>)) fed vLLM's own event objects through
    apply_batch: byte-identical to vLLM's ZmqEventPublisher (the path the plugin takes, without it)."""
    ix, publish, endpoint, replay_endpoint = wirecheck.apply_batch_side(ring_dir, WIRE)
    try:
        check_against_reference(publish, lambda: ix, ring_dir, endpoint, replay_endpoint)
    finally:
        ix.shutdown()


def test_cli_kv_events_config_accepts_kvshm() -> None:
    """`vllm serve --kv-events-config '{"publisher": "kvshm", ...}'` parses once the plugin is loaded. The CLI's
    parser for a config dataclass is `TypeAdapter(KVEventsConfig).validate_json` (vllm/engine/arg_utils.py,
    parse_dataclass); building the whole EngineArgs parser needs a device (a GPU), so the test runs that step."""
    from pydantic import TypeAdapter

    from kvshm.integrations.vllm import register

    register()
    cfg = TypeAdapter(KVEventsConfig).validate_json(json.dumps(
        {"enable_kv_cache_events": True, "publisher": "kvshm", "endpoint": "tcp://*:5557",
         "replay_endpoint": "tcp://*:5558"}))
    assert cfg.publisher == "kvshm" and cfg.replay_endpoint == "tcp://*:5558"
    with pytest.raises(Exception, match="kvshm"):  # the widened Literal still refuses other names
        TypeAdapter(KVEventsConfig).validate_json(json.dumps({"publisher": "bogus"}))
