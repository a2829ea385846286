"""A real Python ring producer for the Go cross-process tests (shm/python_stress_test.go).

Usage::

    ring_stress_producer.py --dir DIR --events N [--capacity BYTES] [--burst B --pause-us U]   # stress stream
    ring_stress_producer.py --dir DIR --vectors testdata/events                  # each shared vector once

Prints one JSON line ``{"path": ..., "epoch": ..., "pid": ..., "native": ...}`` (native: the C extension
publishes, else the x86-64 pure-Python fallback) on stdout as soon as the ring exists, then
publishes, closes the ring (state CLOSED) and prints ``{"done": N, "dropped_events": D}``. It never unlinks the
ring (the Go test owns the directory).

Stress events are derived from their seq (1, 2, 3, ...) so the reader can check every byte without shared state:

* kind: Stored, except every 7th seq (Removed) and every 97th (Cleared); dp_rank = seq % 3;
* nb = ``(((seq mod 2**16) * 2654435761) mod 2**32) >> 26`` blocks (0..63, a multiplicative hash), block hashes
  ``H(seq) + i`` with ``H(seq) = (seq << 16) | (2**63 if seq is odd)`` (values >= 2**63 are exercised);
* Stored: ``nb * 4`` token ids ``seq % 1000003 + j``, parent_hash = ``(seq & 0xFFFFFFFF) * 0x100000001`` (a u64 whose
  halves are equal: a torn 8-byte value shows up as unequal halves), Eagle never, LoRA "lora-0" when
  seq % 5 == 0 else none.

When the ring is full the producer retries the same seq (after ``time.sleep(0)``), so the event stream stays
contiguous and every retry shows up as a LOSS record ``{seq, seq, retries}`` in front of that event.

With ``--burst B --pause-us U`` the producer sleeps a random 0..U µs after every B events, so a reader that keeps up
runs dry and parks on the doorbell again and again: every publication after a pause must ring it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # pybind/src, when not installed

from kvshm import _words  # noqa: E402
from kvshm._ring import RingWriter  # noqa: E402

BLOCK = 4
SIZES = [((i * 2654435761) & 0xFFFFFFFF) >> 26 for i in range(1 << 16)]  # nb(seq) = SIZES[seq & 0xFFFF]


def stress(w: RingWriter, n: int, burst: int = 0, pause_us: int = 0) -> int:
    retries = 0
    stored, removed, cleared = w.publish_stored, w.publish_removed, w.publish_cleared
    sleep = time.sleep
    rng = random.Random(os.getpid())
    for seq in range(1, n + 1):
        if burst and seq % burst == 0:
            sleep(rng.randrange(pause_us + 1) / 1e6)
        nb = SIZES[seq & 0xFFFF]
        h0 = (seq << 16) | ((1 << 63) if seq & 1 else 0)
        dp = seq % 3
        if seq % 97 == 0:
            while not cleared(seq, dp):
                retries += 1
                sleep(0)
        elif seq % 7 == 0:
            hashes = list(range(h0, h0 + nb))
            while not removed(seq, hashes, dp):
                retries += 1
                sleep(0)
        else:
            t0 = seq % 1000003
            tokens = list(range(t0, t0 + nb * BLOCK))
            hashes = list(range(h0, h0 + nb))
            parent = (seq & 0xFFFFFFFF) * 0x100000001
            lora = "lora-0" if seq % 5 == 0 else None
            while not stored(seq, tokens, hashes, parent, dp, lora, False):
                retries += 1
                sleep(0)
    return retries


def vectors(w: RingWriter, d: Path) -> int:
    n = 0
    for p in sorted(d.glob("*.json")):
        ev = json.loads(p.read_text())
        if ev["kind"] == "stored":
            ok = w.publish_stored(ev["seq"], ev["token_ids"], ev["block_hashes"], ev["parent_hash"], ev["dp_rank"],
                                  ev["lora_name"], ev["is_eagle"])
        elif ev["kind"] == "removed":
            ok = w.publish_removed(ev["seq"], ev["block_hashes"], ev["dp_rank"])
        else:
            ok = w.publish_cleared(ev["seq"], ev["dp_rank"])
        if not ok:
            raise SystemExit(f"vector {p.name} did not fit")
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--events", type=int, default=0)
    ap.add_argument("--capacity", type=int, default=64 << 10)
    ap.add_argument("--vectors", type=Path)
    ap.add_argument("--worker-id", type=int, default=11)
    ap.add_argument("--burst", type=int, default=0, help="pause after every BURST events (0: never)")
    ap.add_argument("--pause-us", type=int, default=200, help="longest pause, in µs")
    args = ap.parse_args()
    w = RingWriter.create(args.dir, args.worker_id, BLOCK, 1000, args.capacity)
    native = _words.NATIVE is not None  # RingWriter.create's default: the extension when it is built
    print(json.dumps({"path": w.path, "epoch": w.epoch, "pid": os.getpid(), "native": native}), flush=True)
    if args.vectors is not None:
        done = vectors(w, args.vectors)
    else:
        stress(w, args.events, args.burst, args.pause_us)
        done = args.events
    st = w.stats()
    w.close()
    print(json.dumps({"done": done, "dropped_events": st["dropped_events"]}), flush=True)


if __name__ == "__main__":
    main()
