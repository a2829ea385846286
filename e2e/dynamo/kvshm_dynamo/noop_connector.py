"""A vLLM KV connector that does nothing: what the state-agent modes name in ``--kv-transfer-config``.

``dynamo.vllm`` 1.6.1 reads the state-agent opt-in from ``kv_transfer_config.kv_connector_extra_config``, but
vLLM 0.31.0 treats any ``kv_transfer_config`` as a connector's: the engine core asks the connector factory for the
connector's KV cache layout (``get_kv_connector_cache_layout``), which raises "Connector name is not set in
KVTransferConfig" when there is none, so a worker opted in without a connector never starts. A deployment that
opts in has a connector for other reasons (NIXL for disaggregation, an offloading tier); this one loads nothing,
saves nothing and matches no external token, so the engine's prefix cache, its ``cached_tokens`` and its KV events
are what they are without a connector. Loaded by vLLM through ``kv_connector_module_path`` (this module is on the
workers' PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)


class NoopConnector(KVConnectorBase_V1):  # type: ignore[misc]
    # Worker side: nothing to load or save.
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    # Scheduler side: no external tokens, ever.
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        return KVConnectorMetadata()
