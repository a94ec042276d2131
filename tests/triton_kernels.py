"""Triton kernels and ops for the tests (in a module of their own: Triton needs source files, and worker
processes import kernels by module and name)."""

import torch
import triton
import triton.language as tl

from buildops import BuildConfig, DynamicSpec, lists_kernels


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def rows_kernel(x_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows[:, None] * n_cols + cols[None, :], x * 2, mask=mask)


def _early_prune(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= 4 * triton.next_power_of_2(named_args["n"])]


@triton.autotune(
    configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 256}, num_warps=4),
             triton.Config({"BLOCK": 1024}, num_warps=8)],
    key=["n"], prune_configs_by={"early_config_prune": _early_prune})
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 3)
    else:
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3, mask=mask)


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[1, 16, 64])), output="x")
def double_rows(x):
    """Listed by replay: no lister. The tile height follows the row count."""
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    block_m = 16 if n_rows <= 16 else 64
    rows_kernel[(triton.cdiv(n_rows, block_m),)](x, out, n_rows, n_cols, BLOCK_M=block_m,
                                                 BLOCK_N=triton.next_power_of_2(n_cols))
    return out


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[64, 1000])), output="x")
def triple(x):
    """Listed by replay through @triton.autotune and @triton.heuristics."""
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0)), output="x")
def data_dependent(x):
    block = int(x.abs().max().item())  # needs real data
    out = torch.empty_like(x)
    add_kernel[(1,)](x, x, out, x.numel(), BLOCK=block)
    return out


def _demo_matmul():
    """The demo's matmul (``@triton.jit`` under its autotuner), slow enough to compile (0.2-1 s) that several
    processes building it overlap."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from demo_ops import _matmul_kernel
    return _matmul_kernel.fn


matmul_kernel = _demo_matmul()
MATMUL_VARIANTS = [((torch.float16,) * 3 + (512, 512, 512), {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 32})
                   for m in (16, 32, 64, 128) for n in (32, 64, 128)]
