"""fla's ops, decorated from outside.

Each decorator wraps a thin function that calls fla's public op; fla's own code is untouched. All three list by
replay: buildops runs fla's host code on meta (else fake) tensors at each swept token count and records each Triton
launch it makes (``@triton.autotune`` configs and ``@triton.heuristics`` applied), so the list follows fla's code.

What would need a lister or ``@builds_by_running`` instead: fla's variable-length calls (``cu_seqlens=``), whose
host code derives each chunk's sequence from the boundaries' values (``aten.repeat_interleave`` on them), a shape
no stand-in tensor can give.
"""

from __future__ import annotations

import torch
from fla.modules.activations import swiglu as _fla_swiglu
from fla.modules.norm.layernorm import rms_norm as _fla_rms_norm
from fla.ops.simple_gla import chunk_simple_gla as _fla_chunk_simple_gla

from buildops import BuildConfig, DynamicSpec, lists_kernels

# Tokens vary at run time: dim 0 of the flattened activations, dim 1 of fla's (batch, tokens, heads, dim) layout.
# Powers of two up to the dummy forward's length cover every specialization Triton makes of a token count (1, a
# multiple of 16, neither).
TOKENS = DynamicSpec("x", dim=0, sweep="pow2")


@lists_kernels(BuildConfig(TOKENS), output="x")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _fla_rms_norm(x, weight, None, eps=eps)


@lists_kernels(BuildConfig(TOKENS, DynamicSpec("y", dim=0, follows="x.0")), output="x")
def swiglu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _fla_swiglu(x, y)


@lists_kernels(BuildConfig(DynamicSpec("q", dim=1, sweep="pow2"), DynamicSpec("k", dim=1, follows="q.1"),
                           DynamicSpec("v", dim=1, follows="q.1"), DynamicSpec("g", dim=1, follows="q.1")),
               output="v")
def simple_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Gated linear attention over a whole sequence (fla's chunked kernels); the output only."""
    out, _ = _fla_chunk_simple_gla(q, k, v, g=g)
    return out
