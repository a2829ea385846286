"""kvshm's SGLang plugin against the real SGLang 0.5.23 (make sglang-plugin-test: the engine venv of make e2e-sglang,
build/sglangenv; no GPU: only SGLang's plugin loader, KV-event structs and publisher run).

SGLang's plugin loader (``sglang.srt.plugins.load_plugins``) runs the ``sglang.srt.plugins`` entry point of the kvshm
wheel under test; the test then creates the publisher through ``EventPublisherFactory.create`` with the JSON of
``--kv-events-config`` as SGLang's scheduler does, and publishes real ``KVEventBatch`` objects of SGLang's own
structs: signed int64 block hashes (negative ones among them), a merged chain, SGLang's ``StorageMedium`` values,
``cache_salt``, ``session_id``, bigram (EAGLE) pages. The judge is SGLang's own ``ZmqEventPublisher``, fed the same
batches side by side: live and replayed, byte for byte (pybind/enginetest/wirecheck.py, shared with the vLLM
plugin's test). The committed wire vectors (testdata/vllmwire/vectors_sglang.json) are regenerated here with
SGLang's own structs and must be unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
import pytest

kv_events = pytest.importorskip("sglang.srt.disaggregation.kv_events")
from sglang.srt.disaggregation.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisher,
    EventPublisherFactory,
    KVEventBatch,
    StorageMedium,
    ZmqEventPublisher,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "enginetest"))
import wirecheck  # noqa: E402

from kvshm import LocalIndexer  # noqa: E402
from kvshm.integrations.sglang import KvshmSGLangPublisher  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "testdata" / "vllmwire" / "vectors_sglang.json"


def test_installed_release_is_known() -> None:
    assert version("sglang") == "0.5.23", "kvshm's SGLang wire is SGLang 0.5.23's"
    site = os.environ.get("KVSHM_SGLANG_TEST_SITE")  # make sglang-plugin-test: the wheel under test
    if site:
        import kvshm

        assert Path(kvshm.__file__).resolve().is_relative_to(Path(site).resolve()), kvshm.__file__


def test_vectors_fresh() -> None:
    """vectors_sglang.json is what SGLang's own structs and msgspec write today."""
    out = subprocess.run([sys.executable, str(VECTORS.with_name("gen_sglang_vectors.py")), "-"], check=True,
                         capture_output=True).stdout
    assert out == VECTORS.read_bytes(), f"stale: run {sys.executable} testdata/vllmwire/gen_sglang_vectors.py"


H = [-(2**63), -1, -33, 5, 2**63 - 1, -7_000_000_000_000_000_000, 123_456_789_012]


def batches() -> list[Any]:
    """The test batches, new objects each call (publish() fills in attn_dp_rank). Fixed ts, so SGLang's and
    kvshm's payloads of a batch are comparable byte for byte."""
    return [
        KVEventBatch(ts=1700000001.25, events=[  # a merged chain from the root, negative hashes
            BlockStored(block_hashes=H[:3], parent_block_hash=None, token_ids=list(range(12)), block_size=4,
                        lora_id=None, medium=StorageMedium.GPU),
        ]),
        KVEventBatch(ts=1700000002.5, events=[
            BlockStored(block_hashes=[H[3]], parent_block_hash=H[2], token_ids=[8, 9, 10, 11], block_size=4,
                        lora_id=None, medium=StorageMedium.GPU, cache_salt="salt", session_id="sess-1"),
            BlockRemoved(block_hashes=[H[3]], medium=StorageMedium.GPU),
            BlockStored(block_hashes=[H[4]], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4,
                        lora_id=3, medium=StorageMedium.CPU, lora_name="lora-a"),
            BlockStored(block_hashes=[H[5]], parent_block_hash=None, token_ids=[(5, 6), (6, 7), (7, 8), (8, 9)],
                        block_size=4, lora_id=None, medium=None),
        ]),
        KVEventBatch(ts=1700000003.75, events=[
            BlockRemoved(block_hashes=H[1:3], medium=StorageMedium.GPU),
            BlockStored(block_hashes=[H[6]], parent_block_hash=H[0], token_ids=[7] * 4, block_size=4, lora_id=None,
                        medium=StorageMedium.GPU),
        ]),
        KVEventBatch(ts=1700000004.0, events=[AllBlocksCleared()]),
    ]


SGLANG = wirecheck.Engine(
    batches=batches,
    cleared=lambda ts: KVEventBatch(ts=ts, events=[AllBlocksCleared()]),
    marker_payload=msgspec.msgpack.encode(KVEventBatch(ts=wirecheck.MARKER_TS, events=[AllBlocksCleared()],
                                                       attn_dp_rank=0)),
    reference=lambda ep, rep: ZmqEventPublisher(attn_dp_rank=0, endpoint=ep, replay_endpoint=rep, topic="kv"),
)


def check(publish: Callable[[Any], object], ix: Callable[[], LocalIndexer | None], d: Path, endpoint: str,
          replay_endpoint: str) -> None:
    got = wirecheck.check_against_reference(SGLANG, publish, d, endpoint, replay_endpoint)
    assert any(b"\xd3" in p for _, p in got), "no int64-form hash on the wire"
    # The recovery index: the device events (GPU or no medium) under the seq each went out with, signed hashes
    # keyed by their 64-bit pattern.
    indexer = ix()
    assert indexer is not None
    resp = json.loads(indexer.get_events_json(got[0][0]))
    evs = resp["Events"]["events"]
    s = [seq for seq, _ in got]
    assert [e["event"]["event_id"] for e in evs] == [s[0], s[1], s[1], s[1], s[2], s[2], s[3]], (evs, s)
    first = evs[0]["event"]["data"]["stored"]
    assert [b["block_hash"] for b in first["blocks"]] == [h % 2**64 for h in H[:3]], first


@pytest.fixture
def ring_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    return wirecheck.plugin_env(monkeypatch, "SGLANG_PLUGINS")


def test_kvshm_publisher_in_real_sglang(ring_dir: Path) -> None:
    """The plugin through SGLang's own loader and factory: byte-identical to SGLang's ZmqEventPublisher."""
    d = ring_dir
    cfg = {"publisher": "kvshm", "endpoint": f"ipc://{d}/pub.sock", "replay_endpoint": f"ipc://{d}/replay.sock",
           "topic": "kv"}
    from sglang.srt.plugins import load_plugins

    load_plugins()  # SGLang's own loader runs kvshm's entry point
    pub = EventPublisherFactory.create(json.dumps(cfg), attn_dp_rank=0)
    assert isinstance(pub, KvshmSGLangPublisher) and isinstance(pub, EventPublisher)
    try:
        check(pub.publish, lambda: pub.indexer, d, cfg["endpoint"], cfg["replay_endpoint"])
        assert pub.errors == 0
        src = pub.describe_local_source(4)
        assert src == {"dp_rank": 0, "endpoint": cfg["endpoint"], "topic": "kv", "block_size": 4,
                       "replay_endpoint": cfg["replay_endpoint"]}, src
    finally:
        pub.shutdown()
    with pytest.raises(RuntimeError, match="closed"):  # SGLang's publisher raises it too
        pub.publish(batches()[0])


def test_apply_batch_matches_sglang(ring_dir: Path) -> None:
    """LocalIndexer(publish=ZmqPublish(wire="sglang")) fed SGLang's own event objects through apply_batch:
    byte-identical to SGLang's ZmqEventPublisher (the plugin's path, without it)."""
    ix, publish, endpoint, replay_endpoint = wirecheck.apply_batch_side(ring_dir, "sglang")
    try:
        check(publish, lambda: ix, ring_dir, endpoint, replay_endpoint)
    finally:
        ix.shutdown()


def test_page_size_from_scheduler_frame(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without KVSHM_KV_BLOCK_SIZE the page size comes from SGLang: here (no server arguments published in this
    process) from the constructing scheduler's tree_cache, as SchedulerKvEventsPublisher holds it."""
    monkeypatch.delenv("KVSHM_KV_BLOCK_SIZE")
    d = ring_dir

    class TreeCache:
        page_size = 16

    class SchedulerKvEventsPublisher:  # SGLang's holder: self.tree_cache is set before the publisher is created
        def __init__(self) -> None:
            self.tree_cache = TreeCache()
            self.kv_event_publisher = EventPublisherFactory.create(
                json.dumps({"publisher": "kvshm", "endpoint": f"ipc://{d}/p2.sock"}), 0)

    from sglang.srt.plugins import load_plugins

    load_plugins()
    holder = SchedulerKvEventsPublisher()
    pub = holder.kv_event_publisher
    try:
        assert isinstance(pub, KvshmSGLangPublisher) and pub.kv_block_size == 16
    finally:
        pub.shutdown()
