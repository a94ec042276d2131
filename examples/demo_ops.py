"""Three Triton ops decorated with buildops, with listers that name the exact kernels each launch needs.

On a GPU the ops launch their kernels; on the CPU they compute the same result with torch (the demo only builds
there). The builds compile with ``triton.compile`` for the current GPU, or for sm_90 without one.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from buildops import Build, BuildConfig, DynamicSpec, lists_kernels

TOKENS = BuildConfig(DynamicSpec("x", dim=0, sweep="pow2", max=8192))
_TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@functools.cache
def target() -> GPUTarget:
    if torch.cuda.is_available():
        return triton.runtime.driver.active.get_current_target()
    return GPUTarget("cuda", 90, 32)


def compile_only(op: str, kernel, signature: dict, constexprs: dict, num_warps: int = 4) -> Build:
    """A build that compiles one kernel variant into Triton's cache, without launching it."""
    key = (kernel.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())), num_warps, target())
    source = ASTSource(kernel, {**signature, **{name: "constexpr" for name in constexprs}}, constexprs)
    run = functools.partial(triton.compile, source, target=target(), options={"num_warps": num_warps})
    label = f"{kernel.__name__}[{', '.join(f'{k}={v}' for k, v in constexprs.items())}, warps={num_warps}]"
    return Build(op, key, run, label=label)


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
    if not x.is_cuda:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    out = torch.empty_like(x)
    _rmsnorm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


@rmsnorm.lister
def _(x, weight, eps):
    t = _TRITON_TYPES[x.dtype]
    signature = {"x_ptr": f"*{t}", "w_ptr": f"*{_TRITON_TYPES[weight.dtype]}", "out_ptr": f"*{t}",
                 "n_cols": "i32", "eps": "fp32"}
    return [compile_only("rmsnorm", _rmsnorm_kernel, signature, {"BLOCK": triton.next_power_of_2(x.shape[1])})]


# -- softmax: one program per row; more warps for wide rows ---------------------------------------------------

@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def _softmax_launch(n_cols: int) -> tuple[int, int]:
    block = triton.next_power_of_2(n_cols)
    return block, 8 if block >= 2048 else 4


@lists_kernels(TOKENS, output="x")
def softmax(x: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return torch.softmax(x.float(), -1).to(x.dtype)
    out = torch.empty_like(x)
    block, warps = _softmax_launch(x.shape[1])
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=warps)
    return out


@softmax.lister
def _(x):
    t = _TRITON_TYPES[x.dtype]
    block, warps = _softmax_launch(x.shape[1])
    return [compile_only("softmax", _softmax_kernel, {"x_ptr": f"*{t}", "out_ptr": f"*{t}", "n_cols": "i32"},
                         {"BLOCK": block}, num_warps=warps)]


# -- matmul: the tile height follows the token count, so the sweep needs several variants ---------------------

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


def _matmul_tiles(m: int) -> dict:
    return {"BLOCK_M": 16 if m <= 16 else 32 if m <= 32 else 64, "BLOCK_N": 128, "BLOCK_K": 64}


@lists_kernels(TOKENS, output=lambda x, w: torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device))
def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda:
        return x @ w
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    tiles = _matmul_tiles(x.shape[0])
    grid = (triton.cdiv(x.shape[0], tiles["BLOCK_M"]), triton.cdiv(w.shape[1], tiles["BLOCK_N"]))
    _matmul_kernel[grid](x, w, out, x.shape[0], w.shape[1], x.shape[1], **tiles)
    return out


@matmul.lister
def _(x, w):
    t = _TRITON_TYPES[x.dtype]
    signature = {"a_ptr": f"*{t}", "b_ptr": f"*{t}", "c_ptr": f"*{t}", "M": "i32", "N": "i32", "K": "i32"}
    return [compile_only("matmul", _matmul_kernel, signature, _matmul_tiles(x.shape[0]))]
