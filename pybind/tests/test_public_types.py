"""The public API's types as a user's type checker sees them, and its values as they run.

``make pytest`` runs mypy --strict over this file: each ``assert_type`` fails the type check when a public
signature drifts (a return type, a stats() key's type). pytest runs it too: the values have those types, and
``stats()`` has exactly the keys :class:`kvshm.IndexerStats` documents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, assert_type

import kv_local_indexer
import kvshm
from kvshm import BatchStats, IndexerStats, LocalIndexer, LostRange, ZmqPublish, events


def test_local_indexer_signatures_and_values(tmp_path: Path) -> None:
    with LocalIndexer(3, 4, 100, ring_dir=tmp_path, ring_bytes=1 << 20) as ix:
        assert_type(ix, LocalIndexer)
        assert_type(ix.apply_stored(0, [1, 2, 3, 4], [11]), None)
        assert_type(ix.apply_stored(1, [5, 6, 7, 8], [12], parent_hash=11, dp_rank=0), None)
        assert_type(ix.apply_removed(2, [12]), None)
        batch = [events.BlockStored([13], 11, [9, 10, 11, 12], 4, None, "GPU", None), events.BlockRemoved([13], "GPU")]
        assert_type(ix.apply_batch(3, batch, ts=1.0), None)
        assert_type(ix.apply_cleared(4), None)
        answer = assert_type(ix.get_events_json(0), str)
        assert answer.startswith('{"Events":')
        st = assert_type(ix.stats(), IndexerStats)
        local = assert_type(ix.stats(daemon=False), IndexerStats)
    assert_type(st["worker_id"], int)
    assert_type(st["dp_rank"], int | None)
    assert_type(st["mode"], Literal["shared", "private"])
    assert_type(st["attached"], bool)
    assert_type(st["daemon_pid"], int | None)
    assert_type(st["published_events"], int | None)
    assert_type(st["incomplete"], bool | None)
    assert_type(st["lost_ranges"], list[LostRange] | None)
    assert_type(st["daemon_stream"], dict[str, Any] | None)
    assert_type(st["batch"], BatchStats)
    assert_type(st["batch"]["events"], int)
    # Every documented key and no other; the local keys without the daemon's answer.
    assert set(st) == set(IndexerStats.__annotations__)
    assert set(st["batch"]) == set(BatchStats.__annotations__)
    # Ring records: two Stored, a Removed, one BATCH record for the batch's two events, a Cleared.
    assert (st["worker_id"], st["dp_rank"], st["mode"], st["published_events"]) == (3, None, "private", 5)
    assert st["batch"]["events"] == 2 and st["incomplete"] is False and st["lost_ranges"] == []
    assert isinstance(st["daemon_pid"], int) and isinstance(st["daemon_stream"], dict)
    assert local["daemon_stream"] is None and local["incomplete"] is None


def test_package_level_names() -> None:
    assert_type(kvshm.__version__, str)
    assert_type(kv_local_indexer.LocalIndexer, type[LocalIndexer])
    pub = assert_type(ZmqPublish(endpoint="tcp://*:0"), ZmqPublish)
    assert_type(pub.buffer_steps, int)
    err: type[kvshm.KvshmError] = kvshm.LauncherError
    assert issubclass(err, RuntimeError) and isinstance(kvshm.__version__, str)
    assert kv_local_indexer.LocalIndexer is LocalIndexer
