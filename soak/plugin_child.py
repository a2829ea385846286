"""A soak child running kvshm's vLLM plugin (``KvshmEventPublisher``, as vLLM's scheduler would) on the shared
kvshmd, fed vLLM-shaped batches with bad ones mixed in: events that are not events, an older vLLM's BlockStored
lacking fields (``AttributeError``), objects that are not batches, bad timestamps, another dp rank, bad token ids,
hashes out of range. Commands on stdin, replies on stdout (JSON lines):

* ``{"op": "run", "n": N}``: N good batches and about N/3 bad ones; reply ``{"good": [[ts, digest of the payload
  vLLM's msgspec gives], ...], "bad": {kind: count}, "escaped": [exceptions that reached the caller],
  "errors": publisher.errors}``;
* ``{"op": "shutdown"}``: ``shutdown()``, then one more ``publish``: reply ``{"after_shutdown": "..."}`` (vLLM's
  publisher raises RuntimeError there; so must this one), exit.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "vllmwire"))
import vllm_structs  # type: ignore[import-not-found,unused-ignore]  # noqa: E402  (vLLM 0.33.0's wire, msgspec)

from kvshm import events as ke  # noqa: E402

# Untyped on purpose: the plugin module imports vLLM's names lazily, which the soak's mypy cannot see.
KvshmEventPublisher: Any = importlib.import_module("kvshm.integrations.vllm").KvshmEventPublisher


@dataclass
class Batch:  # vLLM's KVEventBatch's attributes
    ts: Any
    events: Any = field(default_factory=list)
    data_parallel_rank: int | None = None


class BlockStored:  # an older vLLM's BlockStored: no medium, lora_name, ...
    def __init__(self, h: int) -> None:
        self.block_hashes = [h]
        self.parent_block_hash = None
        self.token_ids = [1, 2, 3, 4]
        self.block_size = 4


BAD_TOKENS: Any = ["a", "b", "c", "d"]


def bad_batch(kind: str, rng: random.Random) -> Any:
    h = rng.randrange(1, 1 << 63)
    good = ke.BlockStored([h], None, [1, 2, 3, 4], 4, None, "GPU", None)
    makers: dict[str, Callable[[], Any]] = {
        "not an event": lambda: Batch(1.0, [good, object()]),
        "older vLLM event (AttributeError)": lambda: Batch(1.0, [BlockStored(h)]),
        "not a batch": lambda: rng.choice([None, "batch", 7, [good]]),
        "bad ts": lambda: Batch("now", [good]),
        "another dp rank": lambda: Batch(1.0, [good], data_parallel_rank=rng.randint(1, 9)),
        "bad token ids": lambda: Batch(1.0, [ke.BlockStored([h], None, BAD_TOKENS, 4, None, "GPU", None)]),
        "hash out of range": lambda: Batch(1.0, [ke.BlockRemoved([1 << 70], "GPU")]),
        "events not a list": lambda: Batch(1.0, 12345),
    }
    return makers[kind]()


BAD_KINDS = ["not an event", "older vLLM event (AttributeError)", "not a batch", "bad ts", "another dp rank",
             "bad token ids", "hash out of range", "events not a list"]


def good_batch(rng: random.Random, ts: float) -> tuple[Any, bytes]:
    ours: list[Any] = []
    theirs: list[Any] = []
    for _ in range(rng.randint(1, 4)):
        h = rng.randrange(1, 1 << 63)
        toks = [rng.randrange(0, 1 << 17) for _ in range(4)]
        if rng.random() < 0.7:
            ours.append(ke.BlockStored([h], None, toks, 4, None, "GPU", None))
            theirs.append(vllm_structs.BlockStored([h], None, toks, 4, None, "GPU", None))
        else:
            ours.append(ke.BlockRemoved([h], "GPU"))
            theirs.append(vllm_structs.BlockRemoved([h], "GPU"))
    return Batch(ts, ours), vllm_structs.payload(ts, theirs, 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zmq-dir", required=True)
    ap.add_argument("--seed", type=int, required=True)
    a = ap.parse_args()
    rng = random.Random(f"kvshm-soak-plugin:{a.seed}")
    pub = KvshmEventPublisher(endpoint=f"ipc://{a.zmq_dir}/pub.sock", replay_endpoint=f"ipc://{a.zmq_dir}/rep.sock",
                              buffer_steps=5000)  # the environment gives the socket, worker and block size

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": True})
    ts = 1000.0
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            good: list[list[Any]] = []
            bad: dict[str, int] = {}
            escaped: list[str] = []
            for _ in range(int(cmd["n"])):
                if rng.random() < 0.25:
                    kind = rng.choice(BAD_KINDS)
                    bad[kind] = bad.get(kind, 0) + 1
                    batch: Any = bad_batch(kind, rng)
                else:
                    ts += 1.0
                    batch, payload = good_batch(rng, ts)
                    good.append([ts, hashlib.blake2b(payload, digest_size=16).hexdigest()])
                try:
                    pub.publish(batch)
                except BaseException as e:  # what would reach vLLM's scheduler
                    escaped.append(f"{type(e).__name__}: {e}")
            reply({"good": good, "bad": bad, "escaped": escaped, "errors": pub.errors})
        elif cmd["op"] == "shutdown":
            pub.shutdown()
            try:
                pub.publish(Batch(1.0, [ke.AllBlocksCleared()]))
                after = "no error"
            except RuntimeError as e:
                after = f"RuntimeError: {e}"
            except BaseException as e:
                after = f"{type(e).__name__}: {e}"
            reply({"after_shutdown": after})
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
