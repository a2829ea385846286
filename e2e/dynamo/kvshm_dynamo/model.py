"""The tiny Llama of ``make e2e`` (kvshm_e2e.engine: dummy weights, head_dim 64), made servable by Dynamo's
frontend, which tokenizes and formats itself: ``architectures`` in config.json, a word-level ``tokenizer.json``
(token i is the word ``w<i>``, so a prompt's token ids are exactly the words it names) and a chat template in
tokenizer_config.json (the frontend refuses a model without one, even for completions)."""

from __future__ import annotations

import json
from pathlib import Path

from kvshm_e2e.engine import VOCAB
from kvshm_e2e.engine import make_model as make_e2e_model

FIRST_WORD = 3  # ids 0..2: [UNK], <s>, </s>


def word(token: int) -> str:
    """The word the tokenizer maps to ``token`` (FIRST_WORD <= token < VOCAB)."""
    if not FIRST_WORD <= token < VOCAB:
        raise ValueError(f"token {token} has no word (words are {FIRST_WORD}..{VOCAB - 1})")
    return f"w{token}"


def make_model(path: Path) -> Path:
    """The model directory, made once (kept when it exists)."""
    if (path / "tokenizer.json").exists():
        return path
    make_e2e_model(path)
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(architectures=["LlamaForCausalLM"], bos_token_id=1, eos_token_id=2)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2} | {word(i): i for i in range(FIRST_WORD, VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 1024, "add_bos_token": False,
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
    }))
    return path
