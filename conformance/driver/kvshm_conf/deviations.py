"""The documented deviations: where kvshm answers differently from Dynamo 1.6.1 on purpose.

The reasons live in conformance/README.md's table (one home); this module holds the ids and a one-line title so the
report can name them, and a test checks that both lists agree (the Go checker reads the same ids from the README).
A difference is attributed to a deviation only when the stream generator marked, at that point of the stream, the
pattern the deviation is about (:attr:`kvshm_conf.gen.Stream.marks`); anywhere else a difference is a failure.
"""

from __future__ import annotations

DEVIATIONS: dict[str, str] = {
    "D1": "Cleared on an ALL stream clears every dp rank (1.6.1 clears only the event's rank)",
    "D2": "a child stored under a second copy of its parent's tokens (new hashes) is kept (1.6.1 drops it)",
    "D3": "events kvshm lost (ring full) are named: Kvshm-Lost-Events / Kvshm-State headers, stats, metrics",
    # Documented but not produced by the generator (no marks): a difference of these kinds would be a failure here.
    "D4": "removing a block inside a compressed edge keeps the rest of the edge (1.6.1 drops the worker from it)",
    "D5": "a store reaching an unheld block inside an edge by tokens gives it the new hash (1.6.1 keeps the old)",
    "D6": "backwards ids restart the log; max_buffer_size 0 never serves a stale cached dump",
    # Judged by its own rule (kvshm_conf.batches.partial_start_batch), not by a generator mark.
    "D7": "a start id shared by a batch's events answers the whole batch (1.6.1: a suffix of it, by binary search)",
    "D8": "a start id whose batch the log evicted in part answers a TreeDump (1.6.1: the batch's remaining events)",
}
