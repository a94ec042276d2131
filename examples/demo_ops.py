"""Three Triton ops decorated with buildops.

``softmax`` and ``matmul`` have no hand-written list: buildops lists them by replaying their own host code on fake
tensors with Triton launches recorded (the matmul's ``@triton.autotune`` gives one build per config).
``rmsnorm`` shows a hand-written lister instead, which names its launch with
:func:`buildops.backends.triton.triton_builds`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from buildops import BuildConfig, DynamicSpec, lists_kernels

TOKENS = BuildConfig(DynamicSpec("x", dim=0, sweep="pow2", max=8192))


# -- RMSNorm: one program per row; the kernel depends on the row width (BLOCK) and dtype only ------------------

@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@lists_kernels(TOKENS, output="x")
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out = torch.empty_like(x)
    _rmsnorm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


@rmsnorm.lister
def _(x, weight, eps):
    from buildops.backends.triton import triton_builds

    return triton_builds("rmsnorm", _rmsnorm_kernel, x, weight, x, x.shape[1], eps,
                         BLOCK=triton.next_power_of_2(x.shape[1]))


# -- softmax: one program per row; more warps for wide rows ---------------------------------------------------

@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


@lists_kernels(TOKENS, output="x")
def softmax(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=8 if block >= 2048 else 4)
    return out


# -- matmul: autotuned over tile shapes --------------------------------------------------------------------------

def _matmul_configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64}, num_warps=w, num_stages=s)
            for m, n, w, s in ((16, 128, 4, 4), (64, 128, 4, 3), (128, 128, 8, 3))]


def _prune_by_m(configs, named_args, **kwargs):
    """Tiles much taller than M only waste work: keep those at most twice the next power of two of M."""
    limit = max(16, 2 * triton.next_power_of_2(named_args["M"]))
    return [c for c in configs if c.kwargs["BLOCK_M"] <= limit]


@triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"], prune_configs_by={"early_config_prune": _prune_by_m})
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@lists_kernels(TOKENS, output=lambda x, w: torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device))
def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[1]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _matmul_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))](x, w, out, m, n, k)
    return out
