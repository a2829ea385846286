"""The SGLang harness's own pieces, without a server: the truth plugin's probe of the radix tree, the sgl_kernel
stand-in's one real function, the signed-hash keys (make e2e-sglang runs these in SGLang's venv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kvshm_e2e import truth

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang" / "stub"))


class Binding:
    """The Rust tree core binding's calls the prober makes: handles 0 (root), live ones with their pages' hash
    strings, evicted ones; anything else raises as pyo3 does for an unknown handle."""

    def __init__(self, nodes: dict[int, tuple[list[str], bool]]) -> None:
        self.nodes = nodes
        self.calls = 0

    def _node(self, nid: int) -> tuple[list[str], bool]:
        self.calls += 1
        if nid == 0:
            return [], False
        if nid not in self.nodes:
            raise BaseException(f"unknown node {nid}")  # pyo3's PanicException is a BaseException
        return self.nodes[nid]

    def is_root(self, nid: int) -> bool:
        self._node(nid)
        return nid == 0

    def get_hash_values(self, nid: int) -> list[str]:
        return self._node(nid)[0]

    def is_full_device_evicted(self, nid: int) -> bool:
        return self._node(nid)[1]


def test_truth_prober_reads_live_device_pages() -> None:
    from kvshm_e2e_sglang_truth import _Prober
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    neg, pos = "f" * 16 + "ab", "0" * 15 + "7"
    core: Any = type("Core", (), {})()
    core._binding = Binding({1: ([neg, pos], False), 2: (["1" * 16], True), 5: (["2" * 16], False)})
    p = _Prober()
    got = p.hashes(core)
    assert got == sorted([hash_str_to_int64(neg), 7, hash_str_to_int64("2" * 16)]) and hash_str_to_int64(neg) == -1
    del core._binding.nodes[1]  # evicted for good: never probed again once known dead
    core._binding.nodes[400] = (["3" * 16], False)  # minted far ahead, within the probe window
    assert 7 not in p.hashes(core) and hash_str_to_int64("3" * 16) in p.hashes(core)
    assert 1 in p.dead


def test_truth_file_keys_signed_hashes(tmp_path: Path) -> None:
    from kvshm_e2e_truth import write

    path = tmp_path / "truth.json"
    write(str(path), 2, [-1, 5])
    assert json.loads(path.read_text())["hashes"] == [-1, 5]
    assert truth.read(path) == truth.Truth(frozenset({2**64 - 1, 5}), 2)


def test_stand_in_assigns_slots() -> None:
    torch = pytest.importorskip("torch")
    import sgl_kernel

    table = torch.zeros((3, 8), dtype=torch.int32)
    sgl_kernel.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), table, torch.tensor([1, 0]), torch.tensor([4, 2]),
                                            torch.tensor([10, 11, 12, 20, 21]), 8)
    assert table[2, :5].tolist() == [0, 10, 11, 12, 0] and table[0, :3].tolist() == [20, 21, 0]
    with pytest.raises(NotImplementedError, match="stand-in"):
        sgl_kernel.copy_all_layer_kv_cache_cpu()


def test_truth_prober_window_is_bounded() -> None:
    """A handle beyond the window past the highest live one is not seen (the window bounds each probe's cost)."""
    from kvshm_e2e_sglang_truth import _PROBE_AHEAD, _Prober

    core: Any = type("Core", (), {})()
    core._binding = Binding({3: (["4" * 16], False), 4 + _PROBE_AHEAD: (["5" * 16], False)})
    assert len(_Prober().hashes(core)) == 1


def test_model_tokenizer_has_one_token_per_id(tmp_path: Path) -> None:
    """The tiny model's word-level vocabulary keeps "<unk>" (SGLang's warm-up tokenizes text: unknown words) and
    every id once."""
    from kvshm_e2e.sglang import VOCAB, make_model

    vocab = json.loads((make_model(tmp_path / "m") / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab["<unk>"] == 0 and sorted(vocab.values()) == list(range(VOCAB))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
