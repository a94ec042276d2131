"""Which kernel DeepGEMM picks for a call, without running it: its SM90 heuristics, reproduced.

A DeepGEMM kernel's code (and so its cache entry) holds the shape's N and K, its groups, and the tiling its
heuristics pick for the call (block sizes and the cluster of multiprocessors that share a load), but not M: the
Ms whose calls pick one tiling share one kernel. So a build needs to run one M per tiling, and a serving call at
any other M of the same tiling finds its kernel compiled.

This is ``SM90ArchSpec`` and ``get_best_config`` of ``csrc/jit_kernels/heuristics/sm90.hpp`` and ``common.hpp``,
for the FP8 kernels with per-block scales that buildops builds (``Kernel1D2D``, BF16 output, operands K-major),
as DeepGEMM 2.6 has them (checked against 2.6.1, commit 54e2261). Their cost model compares candidates by a cycle
count computed with integers and 32-bit floats, where near ties are decided: :func:`_cheapest` computes it so too.
A DeepGEMM of another version or architecture is not predicted (:func:`why_not_predicted`): its builds run every M
of the sweep.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PREDICTED_ARCHS", "PREDICTED_VERSIONS", "Tiling", "stages", "tiling", "tilings", "why_not_predicted"]

PREDICTED_VERSIONS = ("2.6.1",)  # DeepGEMM's versions whose heuristics these are (a patch release may change them)
PREDICTED_ARCHS = ("sm_90",)   # the architectures whose heuristics these are (SM100's differ)

# SM90ArchSpec's constants
_SMEM_CAPACITY = 232448           # bytes of shared memory a block may use
_MAX_STAGES = 16
_BLOCK_K = 128                    # 128 bytes of FP8 along K
_BLOCK_N_MAX = 192                # the 1D2D kernel's widest block (register spills beyond)
_WGMMA_M = 64
_FP8, _BF16, _FP32 = 1, 2, 4      # element sizes in bytes
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, order=True)
class Tiling:
    """The tiling DeepGEMM's heuristics pick for a call: with the shape, what its kernel's code depends on (the
    stages, swizzles and threads follow from these)."""

    block_m: int
    block_n: int
    cluster_m: int
    cluster_n: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}" + (f" cluster {self.cluster_m}x{self.cluster_n}"
                                                   if self.cluster_m * self.cluster_n > 1 else "")


def why_not_predicted(version: str, arch: str) -> str | None:
    """None where :func:`tiling` reproduces DeepGEMM ``version``'s choice on ``arch``; otherwise why not."""
    if arch not in PREDICTED_ARCHS:
        return f"its heuristics for {arch} are not reproduced (only for {', '.join(PREDICTED_ARCHS)})"
    found = re.match(r"\d+\.\d+\.\d+", version)
    if found is None or found[0] not in PREDICTED_VERSIONS:
        return f"its heuristics are reproduced for versions {', '.join(PREDICTED_VERSIONS)}, not {version}"
    return None


def tiling(kind: str, m: int, n: int, k: int, groups: int = 1, sms: int = 132, alignment: int = 128,
           block_n_multiple_of: int = 1) -> Tiling:
    """The tiling DeepGEMM picks for one call of ``kind``'s entry point (see :func:`tilings`)."""
    return next(iter(tilings(kind, [m], n, k, groups, sms, alignment, block_n_multiple_of)))


def tilings(kind: str, ms: Iterable[int], n: int, k: int, groups: int = 1, sms: int = 132, alignment: int = 128,
            block_n_multiple_of: int = 1) -> dict[Tiling, list[int]]:
    """The tiling DeepGEMM picks for a call of ``kind``'s entry point at each of ``ms``: the Ms of each, in order.

    Args:
        kind: ``dense``, ``contiguous`` or ``masked`` (as :class:`~buildops.backends.deep_gemm.GemmShape`).
        ms: the calls' Ms: tokens (``dense``), rows (``contiguous``: padded, all experts') or expected rows per
            expert (``masked``).
        n, k: the weights' output and input features.
        groups: the experts of a grouped kind.
        sms: the multiprocessors the kernels are tiled for (DeepGEMM's ``get_num_sms()``).
        alignment: the contiguous layout's row alignment (``get_mk_alignment_for_contiguous_layout()``).
        block_n_multiple_of: what block widths must be a multiple of (``set_block_size_multiple_of``'s second).

    Raises:
        ValueError: DeepGEMM has no tiling for the shape, or ``sms`` is odd (it would fail its own assertions).
    """
    if sms < 2 or sms % 2:
        raise ValueError(f"DeepGEMM tiles for an even number of multiprocessors, not {sms} (its set_num_sms)")
    ms = sorted(set(ms))
    # M enters the choice only through each candidate's blocks along M, ceil(M / block_m), and through the extra
    # candidates of the smallest dense Ms: past 32, the block heights are 64, 128 and 256 (the alignment alone for
    # contiguous), so the Ms up to the next multiple of 64 (of the alignment) choose alike, as that multiple does.
    granule = alignment if kind == "contiguous" else 64

    def stands_for(m: int) -> int:
        return m if kind == "dense" and m <= 32 else -(-m // granule) * granule

    chosen: dict[int, Tiling] = {}
    costed = sorted({stands_for(m) for m in ms})
    # The candidates differ only for the smallest dense Ms, which may also take blocks 16 and 32 high.
    for small in (16, 32, None):
        bucket = [m for m in costed if m not in chosen and (small is None or (kind == "dense" and m <= small))]
        if bucket:
            candidates = _candidates(kind, small, n, k, sms, alignment, block_n_multiple_of)
            if not candidates:
                raise ValueError(f"DeepGEMM has no tiling for {kind} N={n} K={k} on {sms} multiprocessors")
            picks = _cheapest(candidates, bucket, n, k, groups if kind == "masked" else 1, sms)
            chosen.update(zip(bucket, (candidates[i] for i in picks)))
    by_tiling: dict[Tiling, list[int]] = {}
    for m in ms:
        by_tiling.setdefault(chosen[stands_for(m)], []).append(m)
    return by_tiling


@functools.lru_cache(maxsize=256)
def _candidates(kind: str, small: int | None, n: int, k: int, sms: int, alignment: int,
                multiple_of: int) -> tuple[Tiling, ...]:
    """get_layout_candidates, in its order (the first of equally cheap candidates wins); ``small``: the Ms are at
    most 16 or 32 (a dense GEMM then also takes blocks that high)."""
    if kind == "dense":
        block_ms = [64, 128] + ([16] if small == 16 else []) + ([32] if small in (16, 32) else []) + [256]
    elif kind == "contiguous":
        block_ms = [alignment]
    else:
        block_ms = [64, 128]
    step = math.lcm(16, multiple_of)
    candidates = []
    for cluster_m, cluster_n in ((1, 1), (1, 2), (2, 1)):  # clusters of at most 2
        if sms % (cluster_m * cluster_n):
            continue
        for block_m in block_ms:
            for block_n in range(step, _BLOCK_N_MAX + 1, step):
                if block_n > _BLOCK_K and block_n % (block_n - _BLOCK_K) and _BLOCK_K % (block_n - _BLOCK_K):
                    continue  # the 1D2D kernel's unrolling
                if kind == "masked" and -(-n // block_n) % (cluster_m * cluster_n):
                    continue  # multicast in the masked layout
                if block_m > 128 and block_n > 128:
                    continue  # registers
                stages = _stages(block_m, block_n, k)
                if stages < 3 or (block_m * block_n < 128 * 192 and stages < 4):
                    continue  # too few stages to hide the loads
                candidates.append(Tiling(block_m, block_n, cluster_m, cluster_n))
    return tuple(candidates)


def _align(x: int, to: int) -> int:
    return -(-x // to) * to


def stages(tiling: Tiling, k: int) -> int:
    """The pipeline stages of ``tiling``'s kernel for ``k`` input features (part of its code)."""
    return _stages(tiling.block_m, tiling.block_n, k)


def _stages(block_m: int, block_n: int, k: int) -> int:
    """get_pipeline_config's stage count (the swizzles are 128 bytes for FP8 operands K-major: always allowed)."""
    smem_cd = _align(block_m * block_n * _BF16, 1024)
    smem_barriers = _MAX_STAGES * 8 * 2
    uniform_sfb = 1 if _BLOCK_K % block_n == 0 else 2
    smem_extra_sfb = _align(-(-k // _BLOCK_K) * _FP32 * uniform_sfb, 8)
    per_stage = block_m * _BLOCK_K * _FP8 + block_n * _BLOCK_K * _FP8 + _align(block_m * _FP32, 128)
    return min((_SMEM_CAPACITY - (smem_cd + smem_barriers + smem_extra_sfb)) // per_stage, _MAX_STAGES)


def _cheapest(candidates: Sequence[Tiling], ms: Sequence[int], n: int, k: int, groups: int, sms: int) -> list[int]:
    """For each M, the index of the candidate get_layout_info's cycle count makes cheapest: L1 and L2 traffic over
    their bandwidths, over the last wave's use. In tensors of Ms x candidates, with C++'s integer and 32-bit float
    arithmetic (its near ties are decided there; torch's CPU division and casts round as C++'s do)."""
    import torch

    column = functools.partial(torch.tensor, dtype=torch.int64)
    block_m = column([t.block_m for t in candidates])
    block_n = column([t.block_n for t in candidates])
    cluster_m = column([t.cluster_m for t in candidates])
    cluster_n = column([t.cluster_n for t in candidates])
    m = column(ms)[:, None]
    blocks = _ceil_div(m, block_m) * _ceil_div(column(n), block_n) * groups
    waves = _ceil_div(blocks, sms)
    l2_bandwidth = int(min(64.0 * sms, 8e6 / 1.3e3))  # bytes per cycle
    l1_bandwidth = 128 * sms
    l2_ab = k * (block_m // cluster_n + block_n // cluster_m) * _FP8
    l1_ab = k * (block_m + block_n) * _FP8
    l1_tc = k * (torch.clamp(block_m, min=_WGMMA_M) + block_n) * _FP8 + block_m * block_n * _BF16
    cd = block_m * block_n * _BF16
    l2_cycles = torch.div((l2_ab + cd) * blocks, l2_bandwidth, rounding_mode="floor")
    l1_cycles = torch.div((l1_ab + l1_tc + cd) * blocks, l1_bandwidth, rounding_mode="floor")
    efficiency = blocks.to(torch.float32) / (waves * sms).to(torch.float32)
    cycles = (torch.maximum(l1_cycles, l2_cycles).to(torch.float32) / efficiency).to(torch.int64)
    multicast = (cluster_m * cluster_n > 1) & (waves <= 1)  # no multicast within one wave
    cycles = torch.where(multicast, torch.full_like(cycles, _INT64_MAX), cycles)
    return torch.argmin(cycles, dim=1).tolist()  # the first of equal minima, as get_best_config keeps it


def _ceil_div(a: Any, b: Any) -> Any:
    return -((-a) // b)
