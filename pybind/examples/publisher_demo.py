"""kvshm end to end, the way an engine worker uses it: start, publish a synthetic KV-event stream, answer recovery
queries, print the answers.

    python pybind/examples/publisher_demo.py          # with kvshm installed (e.g. build/testenv/bin/python)

The stream imitates a prefix cache with kv_block_size 16 on two attention-DP ranks: requests share system-prompt
prefixes (their own blocks are stored chained under the prompt's last block), one prompt runs with a LoRA adapter,
the cache evicts (removes) and is reset once (cleared). Then the global indexer's recovery calls are answered with
``get_events_json`` exactly as the old ``kv_local_indexer`` extension did.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from kvshm import LocalIndexer, ZmqPublish
from kvshm import events as ke
from kvshm._launcher import find_kvshmd

BS = 16


def synthetic_stream(ix: LocalIndexer, n_requests: int, rng: random.Random) -> int:
    """Publishes about 1.2 events per request; returns the next seq."""
    prompts = [[rng.randrange(150000) for _ in range(BS * 4)] for _ in range(3)]  # 3 system prompts, 4 blocks
    next_hash = -(1 << 62)  # engines send signed 64-bit hashes; kvshm stores their u64 form

    def new_hashes(n: int) -> list[int]:
        nonlocal next_hash
        next_hash += n
        return list(range(next_hash - n, next_hash))

    prefix: dict[tuple[int, int], list[int]] = {}  # (dp_rank, prompt) -> cached prompt block hashes
    owned: dict[int, list[list[int]]] = {0: [], 1: []}  # dp_rank -> suffix chains, oldest first
    seq = 0
    for r in range(n_requests):
        dp, p = r % 2, r % 3
        lora = "sql-adapter" if p == 2 else None
        if (dp, p) not in prefix:  # first use of this prompt on this rank: store it from the root
            prefix[(dp, p)] = new_hashes(4)
            ix.apply_stored(seq, prompts[p], prefix[(dp, p)], parent_hash=None, dp_rank=dp, lora_name=lora)
            seq += 1
        n = rng.randint(1, 6)  # the request's own blocks, chained under the prompt's last block
        chain = new_hashes(n)
        tokens = [rng.randrange(150000) for _ in range(BS * n)]
        ix.apply_stored(seq, tokens, chain, parent_hash=prefix[(dp, p)][-1], dp_rank=dp, lora_name=lora)
        seq += 1
        owned[dp].append(chain)
        if len(owned[dp]) > 50:  # evict the oldest request's blocks
            ix.apply_removed(seq, owned[dp].pop(0), dp_rank=dp)
            seq += 1
        if r == n_requests // 2:  # a cache reset (worker-wide)
            ix.apply_cleared(seq)
            seq += 1
            prefix.clear()
            owned = {0: [], 1: []}
    return seq


def summary(answer: str) -> str:
    value = json.loads(answer)
    (variant, body), = value.items()
    if variant in ("Events", "TreeDump"):
        ids = [e["event"]["event_id"] for e in body["events"]]
        span = f"ids {ids[0]}..{ids[-1]}" if ids else "no events"
        return f"{variant}: {len(ids)} events ({span}), last_event_id {body['last_event_id']}"
    return f"{variant}: {json.dumps(body)}"


def main() -> None:
    rng = random.Random(7)
    t0 = time.perf_counter()
    with LocalIndexer(worker_id=0, kv_block_size=BS, max_buffer_size=1000) as ix:
        print(f"started: {ix!r} in {(time.perf_counter() - t0) * 1000:.1f} ms")
        last = synthetic_stream(ix, 2000, rng) - 1
        print(f"published {last + 1} events (stores with parents, 2 dp_ranks, LoRA, removes, one clear)")
        for start, end in ((last - 3, last), (last - 3, None), (None, None), (0, 10), (last + 5, None), (9, 3)):
            t2 = time.perf_counter()
            answer = ix.get_events_json(start, end)
            ms = (time.perf_counter() - t2) * 1000
            print(f"get_events_json({start}, {end}) -> {summary(answer)}  [{len(answer)} bytes, {ms:.1f} ms]")
        print("newest event as the global indexer receives it:")
        print(json.dumps(json.loads(ix.get_events_json(last))["Events"]["events"][-1]))
        st = ix.stats()
        print(f"stats: published {st['published_events']}, dropped {st['dropped_events']}, "
              f"ring {st['ring']['capacity'] >> 20} MiB at {st['ring_path']}, daemon pid {st['daemon_pid']}")
    print("shut down: daemon stopped, socket and ring removed")
    shared_daemon_over_http(rng)
    kvshmd_publishes_zmq(rng)


def shared_daemon_over_http(rng: random.Random) -> None:
    """Part 2: a node-wide `kvshmd serve --http`, which the global indexer queries directly (GET /kv_recover)."""
    with socket.socket() as probe:  # a free loopback port for the demo
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="kvshm-demo-") as tmp:
        os.chmod(tmp, 0o700)
        sock = os.path.join(tmp, "kvshmd.sock")
        daemon = subprocess.Popen(
            [find_kvshmd(), "serve", "--socket", sock, "--http", f"127.0.0.1:{port}", "--log-level", "warn"])
        try:
            with LocalIndexer(worker_id=42, kv_block_size=BS, socket_path=sock) as ix:
                last = synthetic_stream(ix, 300, rng) - 1
                ix.get_events_json(last)  # waits until the daemon has applied everything published
                base = f"http://127.0.0.1:{port}"
                print(f"\nshared kvshmd (pid {daemon.pid}) with HTTP on {base}; worker 42 published {last + 1} events")
                for query in (f"start={last - 2}&end={last}", "", f"start={last + 9}"):
                    with urllib.request.urlopen(f"{base}/workers/42/kv_recover?{query}", timeout=30) as resp:
                        print(f"GET /workers/42/kv_recover?{query} -> {resp.status} {summary(resp.read().decode())}")
                per_rank_producers(sock, base, rng)
                with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
                    wanted = ("kvshm_resident_blocks", "kvshm_buffered_events", "kvshm_newest_event_id",
                              "kvshm_events_applied_total")
                    for line in resp.read().decode().splitlines():
                        if line.startswith(wanted) and not line.endswith(" 0"):
                            print(f"  {line}")
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    print("shared daemon stopped (SIGTERM: drained, exited 0)" if daemon.returncode == 0
          else f"shared daemon exited {daemon.returncode}")


def per_rank_producers(sock: str, base: str, rng: random.Random) -> None:
    """vLLM's topology on the same shared daemon: worker 43 has one producer per dp rank, each with its own seq
    space (LocalIndexer(..., dp_rank=r)), each rank reachable at its own URL."""
    with (
        LocalIndexer(43, BS, socket_path=sock, dp_rank=0) as r0,
        LocalIndexer(43, BS, socket_path=sock, dp_rank=1) as r1,
    ):
        for ix in (r0, r1):
            for seq in range(5):
                tokens = [rng.randrange(150000) for _ in range(2 * BS)]
                ix.apply_stored(seq, tokens, [rng.getrandbits(63), rng.getrandbits(63)])
            ix.get_events_json(4)  # waits until the daemon has applied them
        print("\nworker 43: two per-rank producers (vLLM), ids 0..4 each")
        for path in ("/kv_recover?start=0&end=4", "/workers/43/kv_recover?start=0&end=4",
                     "/workers/43/dp/0/kv_recover?start=2&end=4", "/workers/43/dp/1/kv_recover?start=0&end=4"):
            try:
                with urllib.request.urlopen(f"{base}{path}", timeout=30) as resp:
                    print(f"GET {path} -> {resp.status} {summary(resp.read().decode())}")
            except urllib.error.HTTPError as e:  # 409: ambiguous, the body lists the URLs to use
                print(f"GET {path} -> {e.code} {json.loads(e.read())['error'][:110]}...")


def kvshmd_publishes_zmq(rng: random.Random) -> None:
    """Part 3: kvshmd as the worker's KV-event publisher. The engine hands each vLLM-shaped batch to
    ``apply_batch`` (one ring write); kvshmd publishes it on ZMQ in vLLM's wire format, which ``kvshmd watch`` (a
    separate process, as a router's listener would be) receives, and answers a replay request."""
    with tempfile.TemporaryDirectory(prefix="kvshm-zmq-") as d:
        os.chmod(d, 0o700)
        pub, replay = f"ipc://{d}/kv.sock", f"ipc://{d}/replay.sock"
        with LocalIndexer(worker_id=44, kv_block_size=BS, publish=ZmqPublish(endpoint=pub, replay_endpoint=replay,
                                                                             topic="kv-events")) as ix:
            print(f"\nworker 44 publishes on {pub} (replay {replay}) through kvshmd: {ix.stats()['publishing']}")
            watcher = subprocess.Popen([find_kvshmd(), "watch", "--count", "3", "--timeout", "20s", pub],
                                       stdout=subprocess.PIPE, text=True)
            seq, parent = 0, None
            while watcher.poll() is None:  # PUB drops what it sends before the subscription arrives: keep going
                hashes = [rng.getrandbits(63) for _ in range(2)]
                tokens = [rng.randrange(150000) for _ in range(2 * BS)]
                batch: list[ke.BlockStored | ke.BlockRemoved] = [ke.BlockStored(hashes, parent, tokens, BS, None,
                                                                                 "GPU", None)]
                if parent is not None and seq % 4 == 3:
                    batch.append(ke.BlockRemoved([parent], "GPU"))
                ix.apply_batch(seq, batch)
                seq, parent = seq + 1, hashes[-1]
                time.sleep(0.02)
            assert watcher.stdout is not None
            seen = []  # kvshmd's wire seqs (docs/lifecycle.md), not the engine's
            for line in watcher.stdout.read().splitlines():
                b = json.loads(line)
                seen.append(b["seq"])
                kinds = ", ".join(f"{e['type']}({len(e['block_hashes'])})" for e in b["events"])
                print(f"  kvshmd watch: topic {b['topic']!r} seq {b['seq']} dp_rank {b['data_parallel_rank']}: "
                      f"{kinds} [{b['payload_bytes']} B msgpack]")
            out = subprocess.run([find_kvshmd(), "watch", "--count", "2", "--timeout", "20s", "--replay", replay,
                                  "--from", str(seen[-2]), pub], capture_output=True, text=True, timeout=30)
            replayed = [json.loads(line)["seq"] for line in out.stdout.splitlines()]
            print(f"  replay from seq {seen[-2]}: {replayed} (the replay socket's buffer)")
            z = ix.stats()["zmq"]
            assert z is not None, "kvshmd publishes this stream"
            print(f"  stats()['zmq']: published {z['published']}, dropped {z['dropped']}, replayed {z['replayed']}; "
                  f"recovery ids are the same seqs: last_event_id "
                  f"{json.loads(ix.get_events_json())['TreeDump']['last_event_id']}")


if __name__ == "__main__":
    main()
