"""The SGLang engine of ``make e2e-sglang``: SGLang 0.5.23's server on CPU with a tiny Llama (dummy weights, a
word-level tokenizer made here), prompts as token ids.

Why these settings (SGLang 0.5.23 on PyPI's torch, no GPU): ``SGLANG_USE_CPU_ENGINE=1`` (without it ``--device cpu``
still reaches for vLLM's custom ops); ``--attention-backend torch_native`` and ``--grammar-backend none`` (the other
backends are GPU kernels); ``--load-format dummy`` (no weights download); a ``config.json`` that lists
``architectures`` (SGLang picks the model class from it: without it start-up fails with a TypeError); a local
word-level tokenizer (``tokenizer.json`` from the ``tokenizers`` package: no hub here; requests carry ``input_ids``,
so it only has to load); ``--page-size 16`` (the KV block size SGLang publishes); ``--max-total-tokens 1024`` (64
pages: a hundred 4-page requests evict). The ``sgl_kernel`` stand-in (``e2e/sglang/stub``, its docstring says why)
goes first on the engine's ``PYTHONPATH``; the truth plugin (``e2e/sglang/truthplugin``) and the kvshm wheel come
from the harness's site (``make e2e-sglang``).

SGLang's own shutdown (SIGTERM): it drains requests, then ``kill_process_tree`` SIGKILLs its children (the
scheduler among them), so an engine publisher's ``shutdown`` never runs; a private kvshmd is no child of it (kvshm
starts it detached) and sees the engine's pid go.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

from kvshm_testkit import http_post

from .engine import Engine, Ports

BLOCK_SIZE = 16
MAX_TOTAL_TOKENS = 1024  # 64 pages of 16 tokens
VOCAB = 1024
STUB = Path(__file__).resolve().parents[1] / "sglang" / "stub"  # the sgl_kernel stand-in


def make_model(path: Path) -> Path:
    """A tiny Llama's config with ``architectures`` and a word-level tokenizer (no weights: SGLang loads dummy
    ones)."""
    if (path / "tokenizer.json").exists():
        return path
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=2048, architectures=["LlamaForCausalLM"], bos_token_id=1,
        eos_token_id=2,
    ).save_pretrained(str(path))
    # One token per id (an id given twice makes the saved vocab keep either token: "<unk>" may go missing and
    # SGLang's warm-up fails to tokenize).
    vocab = {"<unk>": 0} | {f"w{i}": i for i in range(1, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "w1", "eos_token": "w2",
        "model_max_length": 2048}))
    return path


class SGLangEngine(Engine):
    """One worker's SGLang server; each :meth:`start` is a new incarnation on the same ports and worker id."""

    block_size = BLOCK_SIZE

    def __init__(self, model: Path, ports: Ports, publisher: str, env: dict[str, str], logdir: Path) -> None:
        env = dict(env)
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUB), env.get("PYTHONPATH", "")) if p)
        super().__init__(model, ports, publisher, env, logdir)

    def argv(self) -> list[str]:
        kv_events = {"publisher": self.publisher, "endpoint": f"tcp://*:{self.ports.pub}",
                     "replay_endpoint": f"tcp://*:{self.ports.replay}"}
        return [
            sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.model), "--served-model-name",
            "tiny", "--device", "cpu", "--attention-backend", "torch_native", "--grammar-backend", "none",
            "--load-format", "dummy", "--page-size", str(BLOCK_SIZE), "--max-total-tokens", str(MAX_TOTAL_TOKENS),
            "--host", "127.0.0.1", "--port", str(self.ports.http), "--kv-events-config", json.dumps(kv_events),
        ]

    def requests(self, n: int, rng: random.Random) -> int:
        """``n`` generations of 4-page prompts (2 pages from one of 8 shared prefixes, 2 random) plus a few tokens,
        as ``input_ids``; returns how many succeeded. Sequential, as for vLLM."""
        prefixes = [[(p * 97 + i) % VOCAB for i in range(2 * BLOCK_SIZE)] for p in range(8)]
        ok = 0
        for _ in range(n):
            prompt = rng.choice(prefixes) + [rng.randrange(3, VOCAB) for _ in range(2 * BLOCK_SIZE + 5)]
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
            ok += http_post(self.url + "/generate", json.dumps(body).encode(), timeout=60.0).status == 200
        return ok

    def flush_cache(self) -> bool:
        """SGLang's ``POST /flush_cache`` (the radix tree emptied, an AllBlocksCleared published)."""
        return http_post(self.url + "/flush_cache", b"", timeout=30.0).status == 200


__all__ = ["BLOCK_SIZE", "SGLangEngine", "make_model"]
