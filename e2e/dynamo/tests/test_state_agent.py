"""The state-agent modes' pieces against Dynamo 1.6.1 itself: the opt-in an AgentWorker passes is one dynamo.vllm
accepts, and the router's state-agent lines (copied from a run's frontend log) are read as the run reads them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from kvshm_dynamo.stack import Ports
from kvshm_dynamo.state_agent import ADVERTISE, AgentWorker, _messages, cache_owner

ROUTER_LOG = (
    "2026-12-06T20:21:00.857403Z  WARN dynamo_llm::kv_router::indexer::recovery::state_agent: Ignoring stale Worker "
    "event while state source is detached publisher_id=1153131160510185 event_id=92\n"
    "2026-12-06T20:22:33.528073Z  WARN dynamo_llm::kv_router::indexer::recovery::state_agent: KV state-agent event "
    "gap; continuing advisory ingestion publisher_id=1153131160510185 expected=92 actual=93\n"
    "2026-12-06T20:22:33.528109Z  WARN dynamo_llm::kv_router::indexer::recovery::state_agent: Ignoring stale Worker "
    "event while state source is detached publisher_id=1153131160510185 event_id=93\n"
    "2026-12-06T20:22:33.551149Z  INFO dynamo_llm::kv_router::indexer::recovery::subscriber: Using direct-ZMQ KV "
    "event ingress on the application runtime\n"
)


def worker(tmp: Path, index: int) -> AgentWorker:
    return AgentWorker(index, tmp / "model", Ports(http=0, pub=19504, replay=19505), "zmq",
                       {"DYN_FILE_KV": str(tmp / "discovery")}, tmp)


def test_opt_in_is_what_dynamo_vllm_accepts(tmp_path: Path) -> None:
    from dynamo.vllm.state_agent import state_agent_settings

    argv = worker(tmp_path, 2).argv()
    cfg = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    events = json.loads(argv[argv.index("--kv-events-config") + 1])
    config = SimpleNamespace(engine_args=SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=cfg["kv_connector_extra_config"]),
        kv_events_config=SimpleNamespace(**events), enable_prefix_caching=True))
    settings = state_agent_settings(config)
    assert settings is not None
    assert settings.raw_advertise_host == ADVERTISE
    assert settings.cache_owner_ids == {0: cache_owner(2)}
    assert cfg["kv_connector"] and cfg["kv_role"] == "kv_both"  # vLLM 0.31.0 wants a connector (noop_connector.py)
    assert cache_owner(1) != cache_owner(2)


def test_worker_id_from_discovery(tmp_path: Path) -> None:
    d = tmp_path / "discovery" / "v1" / "instances"
    d.mkdir(parents=True)
    (d / "dynamo%2Fbackend%2Fgenerate%2F4dac3be6f97f3f59").touch()  # an older worker's record
    w = worker(tmp_path, 1)
    w._before = frozenset(w._instances())
    assert w.read_id() is None
    (d / "dynamo%2Fbackend%2Fclear%5Fkv%5Fblocks%2F1229ac6d2d5db3").touch()  # not a generate endpoint
    (d / "dynamo%2Fbackend%2Fgenerate%2F1229ac6d2d5db3").touch()
    assert w.read_id() == 0x1229AC6D2D5DB3


def test_router_messages() -> None:
    assert _messages(ROUTER_LOG) == {
        "Ignoring stale Worker event while state source is detached": 2,
        "KV state-agent event gap; continuing advisory ingestion": 1,
    }


def test_applied_by_kind() -> None:
    from kvshm_dynamo.judges import parse_applied

    metrics = "\n".join(
        'dynamo_component_kv_cache_events_applied{dynamo_component="backend",dynamo_namespace="dynamo",'
        f'event_type="{kind}",status="{status}",worker_id="25831d76c7b1bd84"}} {n}'
        for kind, status, n in [("cleared", "ok", 2), ("stored", "ok", 3), ("stored", "block_not_found", 1),
                                ("removed", "ok", 0)])
    assert parse_applied(metrics) == {"ok": 5, "block_not_found": 1}
    assert parse_applied(metrics, by="event_type", status="ok") == {"cleared": 2, "stored": 3, "removed": 0}
