"""The default ring absorbs a paused daemon: 30 s of a busy engine (200 Stored events/s of 32 blocks x 32 tokens,
about 27 MB) fit in the default 64 MiB ring, so a daemon stopped that long (a GC pause, a debugger, a stalled
host) loses nothing, and publishing never waits for it."""

from __future__ import annotations

import os
import signal

import pytest

from kvshm._indexer import DEFAULT_RING_BYTES

from conftest import IndexerFactory
from helpers import event_ids, query, variant

EVENTS = 6000  # 30 s at 200 events/s
BLOCKS = 32
BS = 32


def hashes_of(seq: int) -> list[int]:
    return list(range(seq * BLOCKS + 1, (seq + 1) * BLOCKS + 1))


@pytest.mark.slow
def test_paused_daemon_loses_nothing_with_the_default_ring(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=21, kv_block_size=BS, max_buffer_size=10000, ring_bytes=None)
    st = ix.stats(daemon=False)
    assert st["ring"]["capacity"] == DEFAULT_RING_BYTES == 64 << 20
    pid = st["daemon_pid"]
    assert pid is not None  # a private daemon
    os.kill(pid, signal.SIGSTOP)  # the daemon drains nothing until SIGCONT
    try:
        for seq in range(EVENTS):
            # Root chains with distinct tokens: every block stays resident, none shares a node with another.
            ix.apply_stored(seq, list(range(seq * BLOCKS * BS, (seq + 1) * BLOCKS * BS)), hashes_of(seq))
        st = ix.stats(daemon=False)
        # Everything is in the ring, unread: the calls returned without the daemon.
        assert st["published_events"] == EVENTS and st["dropped_events"] == 0, st
        assert st["ring"]["head"] == 0 and st["ring"]["used"] >= EVENTS * BLOCKS * BS * 4, st["ring"]
    finally:
        os.kill(pid, signal.SIGCONT)
    dump = query(ix)  # the query makes the daemon catch up with the ring first
    assert variant(dump) == "TreeDump", str(dump)[:500]
    assert dump["TreeDump"]["last_event_id"] == EVENTS - 1
    got = [b["block_hash"] for e in dump["TreeDump"]["events"] for b in e["event"]["data"]["stored"]["blocks"]]
    assert sorted(got) == list(range(1, EVENTS * BLOCKS + 1))
    assert event_ids(query(ix, 0)) == list(range(EVENTS))
    st = ix.stats()
    assert st["dropped_events"] == 0 and st["incomplete"] is not True
