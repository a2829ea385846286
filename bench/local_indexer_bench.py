"""Cost of one LocalIndexer publish call, against the ring writer alone and the floor, measured in the same run.

    python bench/local_indexer_bench.py            # with the installed wheel (e.g. build/testenv/bin/python)

Each case publishes into a live private kvshmd (which drains the ring meanwhile) and reports the median over
REPEATS interleaved rounds of the mean per-call time of N calls:

* ``LocalIndexer.apply_*``: what the engine pays (argument checks, lock, encode, one tail store);
* ``RingWriter.publish_*``: the ring writer alone on the same ring (no lock, no LocalIndexer checks);
* floor (Stored only): ``array('I', tokens)`` + ``array('Q', hashes)`` + one copy of each into a mapping
  (the ring's first baseline).

Token ids and hashes are Python lists, as the engine has them; hashes are signed 64-bit (half negative). When
numpy is installed, one more case publishes the same event from numpy arrays (int64 tokens and hashes, a numpy
parent hash): the cost of the conversion path (``tolist()``), for information.
"""

from __future__ import annotations

import mmap
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable

from kvshm import LocalIndexer

N = 1000
REPEATS = 9
BS = 32
BLOCKS = 32


def measure(cases: list[tuple[str, Callable[[int], object]]], seq: list[int]) -> dict[str, float]:
    """Per-call ns of each case: REPEATS rounds, each running every case for N calls in turn (interleaved, so a
    load change on the machine hits every case alike); the median round per case."""
    runs: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(REPEATS):
        for name, fn in cases:
            s0 = seq[0]
            t0 = time.perf_counter_ns()
            for i in range(N):
                fn(s0 + i)
            runs[name].append((time.perf_counter_ns() - t0) / N)
            seq[0] = s0 + N
    return {name: statistics.median(r) for name, r in runs.items()}


def main() -> None:
    rng = random.Random(1)
    tokens = [rng.randrange(0, 150000) for _ in range(BS * BLOCKS)]
    hashes = [rng.randrange(-(1 << 63), 1 << 63) for _ in range(BLOCKS)]
    parent = rng.randrange(-(1 << 63), 1 << 63)
    seq = [0]
    with LocalIndexer(0, BS, ring_bytes=256 << 20) as ix:
        ring = ix._ring  # noqa: SLF001 - the writer alone, on the same ring and daemon
        cases: list[tuple[str, Callable[[int], object]]] = [
            (f"LocalIndexer.apply_stored {BLOCKS}x{BS}", lambda s: ix.apply_stored(s, tokens, hashes, parent)),
            (f"RingWriter.publish_stored {BLOCKS}x{BS}",
             lambda s: ring.publish_stored(s, tokens, hashes, parent, 0, None, False)),
            (f"LocalIndexer.apply_stored {BLOCKS}x{BS} lora+dp",
             lambda s: ix.apply_stored(s, tokens, hashes, parent, 3, "adapter-a")),
            (f"LocalIndexer.apply_removed {BLOCKS}", lambda s: ix.apply_removed(s, hashes)),
            (f"RingWriter.publish_removed {BLOCKS}", lambda s: ring.publish_removed(s, hashes, 0)),
            ("LocalIndexer.apply_cleared", lambda s: ix.apply_cleared(s)),
            ("RingWriter.publish_cleared", lambda s: ring.publish_cleared(s, 0)),
        ]
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            np_tokens, np_hashes, np_parent = np.array(tokens), np.array(hashes, dtype=np.int64), np.int64(parent)
            cases.append((f"LocalIndexer.apply_stored {BLOCKS}x{BS} numpy arrays",
                          lambda s: ix.apply_stored(s, np_tokens, np_hashes, np_parent)))
        pos_hashes = [h & ((1 << 64) - 1) for h in hashes]
        with mmap.mmap(-1, 1 << 20) as mm:

            def floor(_: int) -> None:
                t = array("I", tokens).tobytes()
                h = array("Q", pos_hashes).tobytes()
                mm[0 : len(h)] = h
                mm[4096 : 4096 + len(t)] = t

            cases.append((f"floor array+copy {BLOCKS}x{BS} (unsigned hashes)", floor))
            results = measure(cases, seq)
        st = ix.stats()
        assert st["dropped_events"] == 0, "the ring filled up: the numbers would include drops"
    print(f"python {sys.version.split()[0]}, N={N} calls x {REPEATS} repeats (median of per-call means)")
    for name, ns in results.items():
        print(f"  {name:50s} {ns / 1000:8.2f} us")
    li = results[f"LocalIndexer.apply_stored {BLOCKS}x{BS}"]
    print(f"  ratio apply_stored / floor: {li / results[f'floor array+copy {BLOCKS}x{BS} (unsigned hashes)']:.2f}x,"
          f" apply_stored / publish_stored: {li / results[f'RingWriter.publish_stored {BLOCKS}x{BS}']:.2f}x")


if __name__ == "__main__":
    main()
