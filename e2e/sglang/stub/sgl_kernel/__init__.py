"""A stand-in for ``sgl_kernel``, for the e2e harness only: never installed with kvshm, put on the engine's
PYTHONPATH by ``make e2e-sglang``.

Why: SGLang 0.5.23's CPU path imports two functions from ``sgl_kernel`` at module level
(``copy_all_layer_kv_cache_cpu`` in ``sglang/kernels/ops/kvcache/cache_move.py``, ``assign_req_to_token_pool_cpu`` in
``sglang/srt/mem_cache/allocation.py``, called on every prefill). Their CPU build (``sglang-kernel-cpu``) is not on
PyPI, and PyPI's CUDA ``sglang-kernel`` cannot be imported without libcuda. With this stand-in the real server,
scheduler, radix tree and KV-event publisher run on CPU.

What it holds: ``assign_req_to_token_pool_cpu`` in pure torch (what the CPU kernel does: write each request's
token-slot indices into its row of the req-to-token table), and every other name a function that raises
``NotImplementedError`` when called (an engine path the e2e run must not reach).
"""

from __future__ import annotations

from typing import Any

import torch

__version__ = "0.0.0+kvshm-e2e-stand-in"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor, out_cache_loc: torch.Tensor,
                                 pool_len: int) -> None:
    """Request i's slots ``out_cache_loc[o_i : o_i + n_i]`` (o_i: the slots of the requests before it) go to
    ``req_to_token[req_pool_indices[i], start_offset[i] : end_offset[i]]`` (n_i = end - start), as SGLang's triton
    kernel ``assign_req_to_token_pool`` does on GPU."""
    del pool_len  # the row length: implied by req_to_token's shape
    off = 0
    for i in range(int(req_pool_indices.shape[0])):
        s, e = int(start_offset[i]), int(end_offset[i])
        n = e - s
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


def _missing(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name}: the e2e harness's stand-in has no such kernel")

    call.__name__ = name
    return call


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
