"""The engine: vLLM 0.32.0's OpenAI server on CPU with a tiny Llama (dummy weights, no tokenizer), prompts as
token ids.

Why these settings: ``load_format="dummy"`` needs no weights download; ``skip_tokenizer_init`` no tokenizer files
(prompts are token ids); ``block_size=32`` (the CPU backend wants a multiple of 32); ``num_gpu_blocks_override``
makes the KV cache small enough that a hundred requests evict; head_dim 64 (the CPU attention kernels' sizes).
"""

from __future__ import annotations

import json
import random
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvshm_testkit import Proc, Timeout, http_get, http_post, wait_until

BLOCK_SIZE = 32
NUM_BLOCKS = 64
VOCAB = 1024
READY_TIMEOUT = 300.0  # a server start is ~30 s on an idle 2-core machine; bounded well above it
SIGTERM_TIMEOUT = 60.0


def make_model(path: Path) -> Path:
    """A tiny Llama's config (no weights: the server loads dummy ones)."""
    if (path / "config.json").exists():
        return path
    import transformers

    transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
    ).save_pretrained(str(path))
    return path


@dataclass(frozen=True)
class Ports:
    http: int
    pub: int
    replay: int


class Engine:
    """One worker's engine; each :meth:`start` is a new incarnation (process) on the same ports and worker id."""

    block_size = BLOCK_SIZE  # the KV block size the router is told (SGLangEngine: its page size)

    def __init__(self, model: Path, ports: Ports, publisher: str, env: Mapping[str, str], logdir: Path) -> None:
        self.model = model
        self.ports = ports
        self.publisher = publisher
        self.env = dict(env)
        self.logdir = logdir
        self.proc: Proc | None = None
        self.incarnation = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def log(self) -> Path:
        return self.logdir / f"engine-{self.incarnation}.log"

    def argv(self) -> list[str]:
        kv_events = {
            "enable_kv_cache_events": True, "publisher": self.publisher,
            "endpoint": f"tcp://*:{self.ports.pub}", "replay_endpoint": f"tcp://*:{self.ports.replay}",
        }
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
            "--served-model-name", "tiny", "--load-format", "dummy", "--skip-tokenizer-init",
            "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(NUM_BLOCKS),
            "--max-model-len", "1024", "--max-num-seqs", "8", "--enforce-eager", "--dtype", "float32",
            # On CPU this is the fraction of the machine's memory reserved (default 0.92: refused when other
            # processes use more than 8 %); 5 % is plenty for this model and NUM_BLOCKS blocks.
            "--gpu-memory-utilization", "0.05",
            "--host", "127.0.0.1", "--port", str(self.ports.http),
            "--kv-events-config", json.dumps(kv_events),
        ]

    def start(self) -> None:
        self.incarnation += 1
        self.proc = Proc(f"engine {self.incarnation}", self.argv(), self.log, env=self.env)
        proc = self.proc

        def ready() -> bool:
            if not proc.alive():
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"engine exited with {proc.popen.returncode} while starting:\n{tail}")
            return http_get(self.url + "/health", 2.0).status == 200

        wait_until("engine /health", ready, READY_TIMEOUT, 1.0)

    def sigkill(self) -> None:
        """SIGKILL of the engine's process group (what a crash, the OOM killer of a cgroup or a pod kill does)."""
        if self.proc is not None:
            self.proc.stop(signal.SIGKILL, 30.0, group=True)
            self.proc = None

    def sigterm(self) -> bool:
        """SIGTERM to the server (what ``docker stop``/Kubernetes send): vLLM's own shutdown. Returns whether the
        whole process group was gone within the bound (else it is SIGKILLed)."""
        if self.proc is None:
            return True
        clean = self.proc.stop(signal.SIGTERM, SIGTERM_TIMEOUT)
        self.proc = None
        return clean

    def requests(self, n: int, rng: random.Random) -> int:
        """``n`` completions of 4-block prompts (2 blocks from one of 8 shared prefixes, 2 random) plus a few
        tokens; returns how many succeeded. Sequential: the engine's steps, not the client, are the point."""
        prefixes = [[(p * 97 + i) % VOCAB for i in range(2 * BLOCK_SIZE)] for p in range(8)]
        ok = 0
        for _ in range(n):
            prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(2 * BLOCK_SIZE + 5)]
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0.0}
            ok += http_post(self.url + "/v1/completions", json.dumps(body).encode(), timeout=60.0).status == 200
        return ok


__all__ = ["Engine", "Ports", "Timeout", "make_model"]
