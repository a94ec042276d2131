"""fla's ops the model runs, decorated from outside: RMSNorm and SwiGLU are ``examples.fla_lm``'s (the same ops,
shared), and rotary embedding is decorated here the same way. All three list by replay.

How each is called keeps its kernel variants few, as an engine arranges its calls:

- ``rms_norm`` and ``swiglu`` take the tokens flattened into dim 0, so the batch is no dim of its own. At a hidden
  width over 512, fla's norm runs a row kernel whose grid is the token count; SwiGLU passes the count as an
  unspecialized int. Each compiles its autotuning configs once per width.
- ``rotary`` takes the tokens flattened into dim 1 of fla's ``[B, T, H, D]`` layout with ``B = 1`` (fla's autotuning
  key and its kernel specialise on ``B``), queries and keys together (one head count), and cos/sin tables of a
  fixed number of rows, one per token, gathered from the tokens' positions (``TR``, the table's length, is a
  ``constexpr`` of fla's kernel: a table cut to the token count would compile once per count). Its block of
  tokens ``BT`` grows with the count over the GPU's SMs: a ``"pow2"`` sweep reaches every value.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from fla.modules.rotary import rotary_embedding as _fla_rotary_embedding

from buildops import BuildConfig, DynamicSpec, lists_kernels

from examples.fla_lm.ops import rms_norm, swiglu

__all__ = ["reference_ops", "rms_norm", "rotary", "swiglu", "undecorated_ops"]


@lists_kernels(BuildConfig(DynamicSpec("x", dim=1, sweep="pow2")), output="x")
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[1, tokens, heads, head_dim]``: token ``t`` by row ``t`` of ``cos`` and ``sin``
    (``[rows, head_dim // 2]``, ``rows >= tokens``, ``x``'s dtype)."""
    return _fla_rotary_embedding(x, cos, sin)


def undecorated_ops() -> Any:
    """fla's ops called directly, without buildops' wrappers."""
    plain = [getattr(op, "__wrapped__", op) for op in (rms_norm, swiglu, rotary)]  # BUILDOPS=0: the functions
    return SimpleNamespace(rms_norm=plain[0], swiglu=plain[1], rotary=plain[2])


def reference_ops() -> Any:
    """The same math in plain torch (fp32 inside), for checking the model's wiring on any device."""

    def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    def ref_swiglu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (F.silu(x.float()) * y.float()).to(x.dtype)

    def ref_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens, half = x.shape[1], cos.shape[1]
        c = cos[:tokens].float()[None, :, None, :]
        s = sin[:tokens].float()[None, :, None, :]
        x0, x1 = x[..., :half].float(), x[..., half:2 * half].float()
        return torch.cat([x0 * c - x1 * s, x0 * s + x1 * c, x[..., 2 * half:].float()], -1).to(x.dtype)

    return SimpleNamespace(rms_norm=ref_rms_norm, swiglu=ref_swiglu, rotary=ref_rotary)
