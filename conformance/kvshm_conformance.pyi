"""Dynamo 1.6.1's real LocalKvIndexer and a deepinfra-style consumer (kvshm conformance).

The Rust crate doc (conformance/src/lib.rs) is the reference for every behaviour below.
"""

from collections.abc import Iterable
from typing import SupportsIndex

class LocalIndexer:
    """The old kv_local_indexer extension's API over dynamo-kv-router 1.6.1's LocalKvIndexer."""

    def __init__(self, worker_id: int, kv_block_size: int, max_buffer_size: int = 10000) -> None:
        """kv_block_size == 0 raises RuntimeError."""
    def apply_stored(
        self,
        seq: int,
        token_ids: Iterable[SupportsIndex],
        block_hashes: Iterable[SupportsIndex],
        parent_hash: SupportsIndex | None = None,
        dp_rank: int = 0,
        lora_name: str | None = None,
        is_eagle: bool | None = None,
    ) -> None:
        """Tokens hashed by 1.6.1 over complete windows, zipped with block_hashes (the shorter wins).

        Hashes are ints in [-2**63, 2**64); negatives are two's complement. str, bytes and dict
        are refused with TypeError. RuntimeError only after shutdown().
        """
    def apply_removed(self, seq: int, block_hashes: Iterable[SupportsIndex], dp_rank: int = 0) -> None: ...
    def apply_cleared(self, seq: int, dp_rank: int = 0) -> None: ...
    def get_events_json(self, start: int | None = None, end: int | None = None) -> str:
        """1.6.1's WorkerKvQueryResponse for [start, end], as its serde_json output."""
    def shutdown(self) -> None:
        """Stop the indexer; idempotent."""

class Consumer:
    """deepinfra's global-indexer consumer on 1.6.1's RadixTree; one thread only."""

    def __init__(self, kv_block_size: int | None = None) -> None: ...
    def observe(self, worker_id: int, dp_rank: int, seq: int) -> str:
        """What the live listener would see: "initial", "contiguous", "gap" or "stale"."""
    def apply_live(
        self, worker_id: int, dp_rank: int, op_json: str, kv_block_size: int | None = None
    ) -> str:
        """Apply one trace op line (stored/removed/cleared) under (worker_id, dp_rank) unless stale.

        Returns the observation (see observe). ValueError on a malformed op, a query op, or a
        stored op without a block size.
        """
    def apply_live_batch(
        self, worker_id: int, dp_rank: int, seq: int, ops_json: list[str], kv_block_size: int | None = None
    ) -> str:
        """Apply one live batch (ops sharing seq, as 1.6.1's ZMQ listener applies a batch) unless seq is stale;
        the seq becomes the watermark (also for an empty batch). ValueError on a malformed op or another seq."""
    def apply_recovery(self, worker_id: int, dp_rank: int, response_json: str) -> str:
        """Apply a /kv_recover body as kv_recover.rs does; returns the variant name.

        ValueError when 1.6.1's types do not parse it.
        """
    def watermark(self, worker_id: int, dp_rank: int) -> int | None: ...
    def state(self) -> str:
        """Canonical JSON of the tree: equal trees give equal strings."""
    def find_matches(self, tokens_hashes: Iterable[SupportsIndex]) -> list[tuple[int, int, int]]:
        """(worker_id, dp_rank, matched blocks) for each matching worker, sorted."""

class StandaloneJudge:
    """Dynamo 1.6.1's standalone indexer (WorkerRegistry, its ZMQ listeners, replay, filters, indexer)."""

    def __init__(self, threads: int = 1) -> None: ...
    def register(
        self, worker_id: int, dp_rank: int, endpoint: str, replay_endpoint: str | None, block_size: int
    ) -> None:
        """POST /register: spawns the listener (SUB on endpoint, DEALER on replay_endpoint).

        ValueError when 1.6.1 refuses it (rank registered twice, another block size, block_size 0).
        """
    def pause(self, worker_id: int, dp_rank: int) -> None:
        """POST /test/pause_listener. ValueError for an unknown listener or one not running."""
    def resume(self, worker_id: int, dp_rank: int) -> None:
        """POST /test/resume_listener. ValueError for an unknown listener or one not paused."""
    def workers_json(self) -> str:
        """GET /workers: 1.6.1's WorkerInfo list (listener status per rank)."""
    def dump_json(self) -> str:
        """The indexer's dump_events() (GET /dump's events): RouterEvent JSON list."""
    def state(self) -> str:
        """{tier: canonical state} for each tier holding an event ("device", "host_pinned", ...)."""
    def find_matches(self, tokens_hashes: Iterable[SupportsIndex]) -> list[tuple[int, int, int]]:
        """The device tier's (worker_id, dp_rank, matched blocks), sorted."""
    def log(self) -> list[tuple[str, str, dict[str, str]]]:
        """The indexer's INFO/WARN log lines on this judge's threads: (level, message, fields), oldest first."""

def parse_response(json: str, types: str) -> str:
    """Parse with "1.6.1" or "b2b7868" types; the body re-serialized from them. ValueError on failure."""
