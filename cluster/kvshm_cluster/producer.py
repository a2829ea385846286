"""An engine-like producer: one ``(worker, dp_rank)`` of one node, one process, publishing its seeded cache
(:mod:`.gen`) through kvshm (``LocalIndexer`` on the node's shared kvshmd, ``ZmqPublish`` on TCP) or through vLLM's
own ``ZmqEventPublisher`` (:mod:`.vllmpub`), and answering its truth.

Commands are JSON lines on stdin, replies JSON lines on stdout:

* ``{"op": "run", "hz": H}``: publish one engine step (a batch) every 1/H s until told otherwise;
* ``{"op": "idle"}``: stop the steps; from now on publish a probe (a batch that leaves the cache as it was) every
  :data:`PROBE_S`, as a serving engine keeps publishing; reply ``{"truth": [...], "batches": N}``;
* ``{"op": "quiet"}``: publish nothing; reply the truth;
* ``{"op": "prefill", "blocks": N}``: publish N new blocks in large batches, reply ``{"batches": K, "s": T,
  "last_tokens": [...]}`` (the tokens of the last segment: a router that matches them holds the whole prefill);
* ``{"op": "clear"}``: publish an AllBlocksCleared (the cache empties), reply the truth;
* ``{"op": "truth"}``; ``{"op": "quit"}`` (shutdown the publisher, exit).

Bounded: the process exits when stdin closes (its driver is gone) or after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Final

from kvshm_testkit import serve_kv_recover

from .gen import BLOCK_SIZE, Cache, Event, Removed, Stored

PROBE_S: Final = 0.5


class Publisher:
    """kvshm's or vLLM's publisher behind one call: ``send(events)`` publishes one batch."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.mode = a.mode
        self.rank = a.rank
        self.seq = 0
        if a.mode == "kvshm":
            import kvshm
            from kvshm import events as ke

            self.ke: Any = ke
            # Both publishers offset the ports by the rank themselves: hand them rank 0's endpoints.
            pub = kvshm.ZmqPublish(endpoint=_unoffset(a.pub, a.rank),
                                   replay_endpoint=_unoffset(a.replay, a.rank), buffer_steps=a.buffer_steps,
                                   wire=a.wire, topic=a.topic)
            self.ix: Any = kvshm.LocalIndexer(a.worker, BLOCK_SIZE, socket_path=a.socket,
                                              dp_rank=a.rank, publish=pub, ring_bytes=a.ring_bytes)
        else:
            from . import vllmpub

            self.vm: Any = vllmpub.load(a.vllm_site)
            self.vp: Any = self.vm.ZmqEventPublisher(a.rank, _unoffset(a.pub, a.rank), _unoffset(a.replay, a.rank),
                                                     buffer_steps=a.buffer_steps, topic=a.topic)

        # The engine-served /kv_recover of vLLM's deepinfra fork: Dynamo's LocalKvIndexer in the engine process
        # (the conformance crate's module), fed the same events, served over HTTP (kvshm_testkit.serve_kv_recover).
        self.ref: Any = None
        self.ref_seq = 0
        if a.ref_http:
            import kvshm_conformance

            self.ref = kvshm_conformance.LocalIndexer(a.worker, BLOCK_SIZE)
            host, port = a.ref_http.rsplit(":", 1)
            serve_kv_recover(self.ref, host, int(port))

    def _feed_ref(self, events: list[Event]) -> None:
        for e in events:
            self.ref_seq += 1
            if isinstance(e, Stored):
                self.ref.apply_stored(self.ref_seq, list(e.tokens), list(e.hashes), e.parent, self.rank)
            elif isinstance(e, Removed):
                self.ref.apply_removed(self.ref_seq, list(e.hashes), self.rank)
            else:
                self.ref.apply_cleared(self.ref_seq, self.rank)

    def send(self, events: list[Event]) -> None:
        if self.ref is not None:
            self._feed_ref(events)
        if self.mode == "kvshm":
            ke = self.ke
            out: list[Any] = []
            for e in events:
                if isinstance(e, Stored):
                    out.append(ke.BlockStored(list(e.hashes), e.parent, list(e.tokens), BLOCK_SIZE, None, "GPU", None))
                elif isinstance(e, Removed):
                    out.append(ke.BlockRemoved(list(e.hashes), "GPU"))
                else:
                    out.append(ke.AllBlocksCleared())
            self.ix.apply_batch(self.seq, out, ts=time.time())
        else:
            vm = self.vm
            vout: list[Any] = []
            for e in events:
                if isinstance(e, Stored):
                    vout.append(vm.BlockStored(block_hashes=list(e.hashes), parent_block_hash=e.parent,
                                               token_ids=list(e.tokens), block_size=BLOCK_SIZE, lora_id=None,
                                               medium="GPU", lora_name=None))
                elif isinstance(e, Removed):
                    vout.append(vm.BlockRemoved(block_hashes=list(e.hashes), medium="GPU"))
                else:
                    vout.append(vm.AllBlocksCleared())
            self.vp.publish(vm.KVEventBatch(ts=time.time(), events=vout, data_parallel_rank=self.rank))
        self.seq += 1

    def close(self) -> None:
        if self.mode == "kvshm":
            self.ix.shutdown()
        else:
            self.vp.shutdown()


def _unoffset(endpoint: str, rank: int) -> str:
    host, port = endpoint.rsplit(":", 1)
    return f"{host}:{int(port) - rank}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("kvshm", "vllm"), required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--life", type=int, default=0)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--pub", required=True, help="this rank's PUB endpoint (tcp://*:PORT, the rank's port)")
    ap.add_argument("--replay", required=True)
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--wire", default="0.32", help="kvshm: ZmqPublish.wire (array: the layout llm-d decodes)")
    ap.add_argument("--topic", default="", help="the ZMQ topic of every batch (llm-d reads the pod from it)")
    ap.add_argument("--socket", default=None, help="kvshm: the node's kvshmd socket")
    ap.add_argument("--ring-bytes", type=int, default=4 << 20)
    ap.add_argument("--capacity", type=int, default=2000)
    ap.add_argument("--vllm-site", default=None)
    ap.add_argument("--ref-http", default=None, help="also serve /kv_recover from Dynamo's LocalKvIndexer on IP:PORT")
    ap.add_argument("--max-seconds", type=float, default=1800.0)
    a = ap.parse_args()

    cache = Cache(a.seed, a.worker, a.rank, a.life, a.capacity)
    pub = Publisher(a)
    lock = threading.Lock()
    state: dict[str, Any] = {"mode": "quiet", "hz": 0.0, "batches": 0}
    stop = threading.Event()

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def truth() -> dict[str, Any]:
        return {"truth": sorted(cache.blocks), "batches": state["batches"], "seq": pub.seq}

    def loop() -> None:
        next_probe = 0.0
        while not stop.is_set():
            with lock:
                mode, hz = state["mode"], state["hz"]
                if mode == "run":
                    pub.send(cache.step())
                    state["batches"] += 1
                elif mode == "idle" and time.monotonic() >= next_probe:
                    pub.send(cache.probe())
                    state["batches"] += 1
                    next_probe = time.monotonic() + PROBE_S
            stop.wait(1.0 / hz if mode == "run" and hz > 0 else 0.05)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    threading.Timer(a.max_seconds, lambda: os._exit(3)).start()
    reply({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        with lock:
            if op == "run":
                state.update(mode="run", hz=float(cmd["hz"]))
                reply({"ok": True})
            elif op in ("idle", "quiet"):
                state["mode"] = op
                reply(truth())
            elif op == "clear":
                pub.send([cache.clear()])
                state["batches"] += 1
                reply(truth())
            elif op == "truth":
                reply(truth())
            elif op == "prefill":
                t0 = time.monotonic()
                batches = cache.prefill(int(cmd["blocks"]))
                for b in batches:
                    pub.send(b)
                    state["batches"] += 1
                last = batches[-1][-1] if batches else None
                reply({"batches": len(batches), "s": time.monotonic() - t0,
                       "last_tokens": list(last.tokens) if isinstance(last, Stored) else []})
            elif op == "quit":
                stop.set()
                pub.close()
                reply({"bye": True})
                break
    stop.set()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
