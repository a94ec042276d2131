"""DeepGEMM's GEMM shapes: what a model's FP8 weights are, and which Ms a build runs each at."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..._config import settings
from .knobs import DEFAULT_SMS
from .versions import BLOCK, BLOCK_MS, BLOCK_N_MAX, BLOCK_N_STEP, KINDS, MASKED_ROWS, SCALE_ROWS_ALIGNMENT
from .versions import DEFAULT_ALIGNMENT as ALIGN_M

__all__ = ["GemmShape", "contiguous_rows", "find_gemm_shapes", "m_values", "shape_ms"]

_MODES = ("relaxed", "full", "off")
_GROUPED = ("contiguous", "masked")
# The relaxed M sweep (m_values), besides DeepGEMM's block shapes (.versions):
_SMALL_MS = (1, 2, 4, *range(8, 65, 8))   # small Ms, each of which may pick its own kernel
_MAX_WAVES = 10                           # the whole waves of the GPU's multiprocessors the sweep covers

@dataclass(frozen=True)
class GemmShape:
    """One weight shape a model runs through DeepGEMM: ``(N, K)`` dense, or ``(E, N, K)`` for a grouped kind.

    Args:
        kind: ``dense``, or ``contiguous`` or ``masked`` for MoE experts (the layout DeepGEMM's grouped GEMM takes).
        n: the output features.
        k: the input features.
        experts: the experts of a grouped kind; 1 for ``dense``.
    """

    kind: str
    n: int
    k: int
    experts: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"GemmShape kind {self.kind!r}: expected one of {sorted(KINDS)}")
        for name in ("n", "k", "experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GemmShape({self.kind!r}) {name}={value!r}: expected an int >= 1")
        if self.kind == "dense" and self.experts != 1:
            raise ValueError("GemmShape('dense') has no experts")

    def describe(self) -> str:
        """DeepGEMM's entry point and the sizes, as reports and logs name the shape."""
        return f"{KINDS[self.kind]} E={self.experts} N={self.n} K={self.k}"

    def operand_bytes(self, m: int, align_m: int = ALIGN_M) -> int:
        """Bytes of the dummy operands for ``m`` rows (tokens; per expert for ``masked``), and of the copy of the
        activations' scales DeepGEMM makes in each call; ``align_m``: the contiguous layout's row alignment."""
        kb, nb = math.ceil(self.k / BLOCK), math.ceil(self.n / BLOCK)
        rows = rows_for(self, m, align_m)
        # DeepGEMM's MN-major copy of the scales: each group's rows padded to a multiple of 4 (16 bytes)
        scale_rows = align(rows, SCALE_ROWS_ALIGNMENT)
        a = rows * self.k + (rows + scale_rows) * kb * 4       # fp8 activations, their fp32 scales and the copy
        b = self.experts * (self.n * self.k + nb * kb * 4)     # fp8 weights and their fp32 scales
        d = rows * self.n * 2                                  # bf16 output
        return a + b + d + (rows * 4 if self.kind == "contiguous" else self.experts * 4)


def align(x: int, to: int) -> int:
    return math.ceil(x / to) * to


def rows_for(shape: GemmShape, m: int, align_m: int = ALIGN_M) -> int:
    """The rows of a call's activations: ``m``, ``m`` padded to ``align_m`` (contiguous), or ``m`` padded to 64 per
    expert (masked)."""
    if shape.kind == "masked":
        return shape.experts * align(m, MASKED_ROWS)
    if shape.kind == "contiguous":
        return align(m, align_m)
    return m


def m_values(max_tokens: int, n: int, mode: str | None = None, sms: int = DEFAULT_SMS) -> tuple[int, ...]:
    """The M values to build for a layer of width ``n``, up to ``max_tokens``.

    ``full``: every M. ``relaxed``: the small Ms (1, 2, 4, then multiples of 8 up to 64), the multiples of
    DeepGEMM's block heights (64, 128, 256), the Ms at which a tiling by those heights and by block widths of 16 to
    256 fills up to 10 whole waves of the GPU's ``sms`` multiprocessors, and ``max_tokens``: where DeepGEMM's
    heuristics may pick another kernel. ``off``: none.

    Args:
        max_tokens: the largest M.
        n: the layer's output features.
        mode: ``full``, ``relaxed`` or ``off`` (default: ``BUILDOPS_DEEP_GEMM_M``).
        sms: the GPU's multiprocessors (default 132, an H100's or H200's).
    """
    mode = mode or settings.deep_gemm_m
    if mode not in _MODES:
        raise ValueError(f"m_values mode={mode!r}: expected one of {list(_MODES)} (as BUILDOPS_DEEP_GEMM_M)")
    if mode == "off" or max_tokens < 1:
        return ()
    if mode == "full":
        return tuple(range(1, max_tokens + 1))
    values = {*_SMALL_MS, max_tokens}
    for block_m in BLOCK_MS:
        values.update(range(block_m, max_tokens + 1, block_m))
        for block_n in range(BLOCK_N_STEP, min(BLOCK_N_MAX, n) + 1, BLOCK_N_STEP):
            for waves in range(1, _MAX_WAVES + 1):
                values.add(waves * sms * block_m // math.ceil(n / block_n))
    return tuple(sorted(v for v in values if 1 <= v <= max_tokens))


def find_gemm_shapes(model: nn.Module, grouped: Sequence[str] = ("contiguous",)) -> list[GemmShape]:
    """The DeepGEMM shapes of a model's FP8 weights: 2-D ones as dense ``(N, K)``, 3-D ones as ``(E, N, K)``.
    Deduplicated, in the model's order.

    Args:
        model: the model, whose parameters' shapes are read (their values need not be loaded).
        grouped: the grouped kinds each 3-D weight gets a shape of (how the model's MoE layers call DeepGEMM).
    """
    grouped = checked_grouped(grouped, "find_gemm_shapes")
    shapes: dict[GemmShape, None] = {}
    for parameter in model.parameters():
        if parameter.dtype != torch.float8_e4m3fn:
            continue
        if parameter.dim() == 2:
            shapes[GemmShape("dense", *parameter.shape)] = None
        elif parameter.dim() == 3:
            for kind in grouped:
                shapes[GemmShape(kind, parameter.shape[1], parameter.shape[2], parameter.shape[0])] = None
    return list(shapes)


def checked_grouped(grouped: Iterable[str], where: str) -> tuple[str, ...]:
    try:
        kinds = None if isinstance(grouped, str) else tuple(grouped)
    except TypeError:  # not iterable
        kinds = None
    if kinds is None or not all(kind in _GROUPED for kind in kinds):
        raise ValueError(f"{where}(grouped={grouped!r}): expected a tuple of {' and/or '.join(map(repr, _GROUPED))}, "
                         f"the layouts the model's MoE layers call DeepGEMM with, e.g. grouped=('masked',)")
    return kinds


def contiguous_rows(max_tokens: int, experts: int, top_k: int = 1, align_m: int = ALIGN_M) -> int:
    """The most rows a contiguous grouped GEMM takes for ``max_tokens`` tokens: each token's ``top_k`` rows, and
    each expert's rows padded to ``align_m`` (up to ``align_m - 1`` padding rows per expert), as an engine lays them
    out for DeepGEMM (vLLM sizes its workspace so too)."""
    return align(max_tokens * top_k + experts * (align_m - 1), align_m)


def shape_ms(shape: GemmShape, max_tokens: int, mode: str | None = None, sms: int = DEFAULT_SMS, top_k: int = 1,
             align_m: int = ALIGN_M) -> tuple[int, ...]:
    """The Ms a build of ``shape`` runs for up to ``max_tokens`` tokens: :func:`m_values` up to the tokens, or for a
    ``contiguous`` shape up to its :func:`contiguous_rows` (its M is the padded rows)."""
    if max_tokens < 1:
        return ()
    most = contiguous_rows(max_tokens, shape.experts, top_k, align_m) if shape.kind == "contiguous" else max_tokens
    return m_values(most, shape.n, mode, sms)


