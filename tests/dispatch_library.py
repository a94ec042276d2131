"""A Triton operator library with a dispatch layer of its own, written for the tests as such libraries are written.

Each pattern a widely used library puts between its ops and Triton:
  * a launch cache (:class:`LaunchCache`): a kernel's ``run`` is called once per key of the library's own (tensor
    dtypes and pointer alignment, how ints specialize, constexprs), the compiled kernel it returns is kept, and every
    later launch at that key launches the kept kernel directly (``kernel[grid](*args)``);
  * a tuner read back: for an autotuned kernel the cache reads the tuner's ``best_config`` after that first run and
    keeps its constexprs, which the grid of each later launch is computed from;
  * an autotuning key that holds an exact size (the row count: ``softmax_tuned`` tunes at every new one);
  * aten-style op functions, ``self`` first (``softmax(self, dim)``, ``silu(self)``);
  * aten overrides: :func:`register` gives aten ops Python kernels with ``torch.library.Library("aten", "IMPL")``.
Nothing here knows of buildops.
"""

import threading

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction


class LaunchCache:
    """Launches ``fn`` (a ``JITFunction``, possibly under ``@triton.autotune``) through a cache of compiled kernels."""

    def __init__(self, fn):
        self.fn = fn
        jit = fn
        while not isinstance(jit, JITFunction):
            jit = jit.fn
        self.jit = jit
        self.kernels = {}  # (device, key) -> (compiled kernel, constexprs read back)
        self.lock = threading.Lock()

    @staticmethod
    def _part(value):
        if hasattr(value, "data_ptr"):
            return value.dtype, value.data_ptr() % 16 == 0
        if isinstance(value, int) and not isinstance(value, bool):
            return int, value == 1, value % 16 == 0
        return type(value), value

    def key(self, args, kwargs):
        return (driver.active.get_current_device(), tuple(self._part(a) for a in args),
                tuple(sorted((name, self._part(v)) for name, v in kwargs.items())))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def run(self, *args, grid, **kwargs):
        key = self.key(args, kwargs)
        entry = self.kernels.get(key)
        if entry is None:
            with self.lock:
                kernel = self.fn.run(*args, grid=grid, warmup=False, **kwargs)  # compiles, then launches
                constexprs = dict(kwargs)
                fn = self.fn
                while not isinstance(fn, JITFunction):
                    if isinstance(fn, Autotuner):
                        constexprs.update(fn.best_config.all_kwargs())
                    fn = fn.fn
                self.kernels[key] = (kernel, constexprs)
            return kernel
        kernel, constexprs = entry
        named = {**dict(zip(self.jit.arg_names, args)), **kwargs, **constexprs}
        if callable(grid):
            grid = grid(named)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        kernel[grid](*[named.get(p.name, p.default) for p in self.jit.params])
        return kernel


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=[triton.Config({"ROWS": 1}, num_warps=4), triton.Config({"ROWS": 2}, num_warps=4),
                          triton.Config({"ROWS": 4}, num_warps=8)],
                 key=["n_rows", "n_cols"])
@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        mask = (cols < n_cols) & (row < n_rows)
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x / (1.0 + tl.exp(-x))).to(out_ptr.dtype.element_ty), mask=mask)


# The same kernel under a tuner of its own, launched plainly: its key holds the exact row count
_softmax_tuned_kernel = triton.autotune(configs=_softmax_kernel.configs, key=["n_rows", "n_cols"])(_softmax_kernel.fn)

rms_norm_launcher = LaunchCache(_rms_norm_kernel)
softmax_launcher = LaunchCache(_softmax_kernel)
silu_launcher = LaunchCache(_silu_kernel)
SILU_BLOCK = 1024


def rms_norm(input, weight, eps=1e-6):
    out = torch.empty_like(input)
    rows, cols = input.shape
    rms_norm_launcher[(rows,)](input, weight, out, cols, eps, BLOCK=triton.next_power_of_2(cols))
    return out


def _softmax_rows(kernel, self, dim):
    if dim not in (-1, self.dim() - 1):
        raise NotImplementedError("softmax over the last dim only")
    x = self.reshape(-1, self.shape[-1])
    out = torch.empty_like(x)
    n_rows, n_cols = x.shape
    kernel[lambda meta: (triton.cdiv(n_rows, meta["ROWS"]),)](x, out, n_rows, n_cols,
                                                              BLOCK=triton.next_power_of_2(n_cols))
    return out.view(self.shape)


def softmax(self, dim=-1):
    return _softmax_rows(softmax_launcher, self, dim)


def softmax_tuned(self, dim=-1):
    """``softmax`` launched plainly through its tuner: every new row count tunes."""
    return _softmax_rows(_softmax_tuned_kernel, self, dim)


def silu(self):
    out = torch.empty_like(self)
    n = self.numel()
    silu_launcher[(triton.cdiv(n, SILU_BLOCK),)](self, out, n, BLOCK=SILU_BLOCK)
    return out


def register(dispatch_key="CUDA"):
    """Run ``torch.nn.functional.silu`` through this library on ``dispatch_key``'s tensors, as libraries that
    override aten ops do; returns the ``Library``, whose ``_destroy()`` takes the override back."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("silu", silu, dispatch_key)
    return lib


def forget():
    """Empty the launch caches (a fresh process, as far as this library knows)."""
    for launcher in (rms_norm_launcher, softmax_launcher, silu_launcher):
        launcher.kernels.clear()
