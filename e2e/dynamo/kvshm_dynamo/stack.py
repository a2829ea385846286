"""Dynamo's serving stack as processes: the frontend (OpenAI HTTP + the KV router) and ``dynamo.vllm`` workers,
each a kvshm_testkit ``Proc`` in its own process group, configured as issue-free as a new user can: no etcd, no
NATS (``--discovery-backend file``, ``--request-plane tcp``, ``--event-plane zmq``), everything on 127.0.0.1 in
the run's network namespace (netns.py)."""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from kvshm_e2e.engine import Engine, Ports

from kvshm_testkit import Proc, Timeout, http_get, wait_until

MODEL_NAME = "tiny"
BLOCK_SIZE = 32  # the CPU backend wants a multiple of 32
NUM_BLOCKS = 64  # per worker: a few dozen 4-block requests evict
READY_TIMEOUT = 420.0  # a worker's start is 1-3 min on a busy 2-core machine; bounded well above
FRONTEND_TIMEOUT = 60.0
PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
_WORKER_ID = re.compile(r"Initializing KvEventPublisher for worker (\d+)")


def stack_env(base: Mapping[str, str], discovery: Path) -> dict[str, str]:
    """The environment every process of one stack shares: the file discovery store, loopback request plane,
    no system port (``DYN_SYSTEM_PORT`` is parsed as an i16: -1 turns it off), the router's routing decisions in
    its log."""
    env = dict(base)
    env.update({
        "DYN_FILE_KV": str(discovery), "DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_SYSTEM_PORT": "-1", "DYN_LOG": "info,dynamo_llm::kv_router=debug", "NO_COLOR": "1",
    })
    return env


class Frontend:
    """``python -m dynamo.frontend --router-mode kv``: each :meth:`start` a new process (a new router, which
    rebuilds its index from the workers' recovery endpoints)."""

    def __init__(self, port: int, env: Mapping[str, str], logdir: Path) -> None:
        self.port = port
        self.env = dict(env)
        self.logdir = logdir
        self.proc: Proc | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.logdir / f"frontend-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "dynamo.frontend", "--router-mode", "kv", "--http-host", "127.0.0.1",
                "--http-port", str(self.port), *PLANES]
        self.proc = Proc(f"frontend {self.starts}", argv, self.log, env=self.env)
        wait_until("frontend /health", lambda: http_get(self.url + "/health", 2.0).status != 0, FRONTEND_TIMEOUT, 0.5)

    def serves(self, worker_ids: set[int]) -> bool:
        """The model is listed and the router has seen every one of ``worker_ids``."""
        r = http_get(self.url + "/v1/models", 2.0)
        if not r.ok or MODEL_NAME not in r.text:
            return False
        text = self.log.read_text(errors="replace")
        return all(f"worker_id: {w}" in text for w in worker_ids)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL, 10.0, group=True)
            self.proc = None


class Worker(Engine):
    """One ``python -m dynamo.vllm`` worker (vLLM 0.31.0 on CPU): make e2e's Engine (its process, SIGKILL of the
    group, SIGTERM) with Dynamo's command line. Each :meth:`start` is a new incarnation on the same ports and (for
    kvshm) the same ``KVSHM_WORKER_ID``; Dynamo gives every process a new instance id (:attr:`dynamo_id`, read from
    its log). ``ports.http`` is unused: the frontend serves HTTP."""

    def __init__(self, index: int, model: Path, ports: Ports, publisher: str, env: Mapping[str, str],
                 logdir: Path) -> None:
        super().__init__(model, ports, publisher, env, logdir)
        self.index = index
        self.dynamo_id: int | None = None
        self.ids: dict[int, int] = {}  # every Dynamo instance id this worker had -> its index

    @property
    def log(self) -> Path:
        return self.logdir / f"worker{self.index}-{self.incarnation}.log"

    def argv(self) -> list[str]:
        # vLLM 0.31.0's ZmqEventPublisher binds only tcp://*:P and ipc:// (anything else is connected and nothing
        # flows); Dynamo's relay connects to the endpoint with * replaced by 127.0.0.1.
        kv_events = {"enable_kv_cache_events": True, "publisher": self.publisher,
                     "endpoint": f"tcp://*:{self.ports.pub}", "replay_endpoint": f"tcp://*:{self.ports.replay}"}
        return [
            sys.executable, "-m", "dynamo.vllm", "--model", str(self.model), "--served-model-name", MODEL_NAME,
            *PLANES, "--load-format", "dummy", "--block-size", str(BLOCK_SIZE),
            "--num-gpu-blocks-override", str(NUM_BLOCKS), "--kv-cache-memory-bytes", str(64 << 20),
            "--max-model-len", "1024", "--max-num-seqs", "8", "--enforce-eager", "--dtype", "float32",
            "--kv-events-config", json.dumps(kv_events),
        ]

    def start(self, frontend: Frontend | None = None) -> None:
        """Starts the next incarnation; returns once its Dynamo id is known and (with a frontend) the router
        serves it."""
        self.incarnation += 1
        self.dynamo_id = None
        proc = self.proc = Proc(f"worker {self.index}.{self.incarnation}", self.argv(), self.log, env=self.env)

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"worker {self.index} exited with {proc.returncode} while starting:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            if self.dynamo_id is None:
                self.dynamo_id = self.read_id()
                if self.dynamo_id is None:
                    return False
                self.ids[self.dynamo_id] = self.index
            return frontend is None or frontend.serves({self.dynamo_id})

        wait_until(f"worker {self.index} serving", up, READY_TIMEOUT, 1.0)

    def read_id(self) -> int | None:
        """This incarnation's Dynamo instance id once its log names it (its KV event relay's first line), else
        None."""
        m = _WORKER_ID.search(self.log.read_text(errors="replace"))
        return int(m.group(1)) if m is not None else None


__all__ = ["BLOCK_SIZE", "Frontend", "MODEL_NAME", "Ports", "Timeout", "Worker", "stack_env"]
