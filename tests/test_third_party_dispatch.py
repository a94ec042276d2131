"""Real libraries from the package registry whose dispatch layer keeps what a Triton launch returns, decorated from
outside: after a pass, what their caches hold resolves to the compiled kernels a lazy run would have kept, and a
real call reaches them having compiled nothing (sm_90 through the compile-only driver where there is no GPU).

  * flashnn 0.1.1 (``flashnn/triton_kernels/triton_utils.py``): ``compile_and_cache_kernels`` keeps
    ``fn[grid](...)``'s result in ``TRITON_KERNELS_CACHE``, keyed on the launch's constexprs alone, and launches
    the kept kernel with ``kernel[grid](*args)`` from then on.
  * unsloth 2026.10.9 (``unsloth/kernels/triton_launch.py``): ``launch`` keeps ``kernel[grid](...)``'s result per
    specialization and launches it with ``compiled.run(grid0, grid1, grid2, stream, compiled.function,
    compiled.packed_metadata, ...)``. ``import unsloth`` wants a GPU; the module imports only torch and triton, so
    it is loaded from unsloth's installed files by path.
"""

import contextlib
import importlib.util
import pathlib

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from buildops import BuildConfig, DynamicSpec, build_pass, late_compiles, lists_kernels, settings
from buildops.backends.triton import driver, target
from buildops.backends.triton.pending import PendingKernel

E, N, K = 8, 256, 128  # experts, and each expert's weight of N x K


@pytest.fixture(autouse=True)
def compiles(tmp_path, monkeypatch):
    """A fresh Triton cache; the Triton compiles seen, by kernel name."""
    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    seen = []
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["fn"].name)
    yield seen
    knobs.runtime.jit_post_compile_hook = previous


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def looking_up_only():
    """Every Triton launch in the block only looks its kernel up (compiling what is missing), as ``warmup`` does."""
    run = JITFunction.run

    def lookup(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = lookup
    try:
        yield
    finally:
        JITFunction.run = run


def reaches_the_built_kernel(call):
    """Run a real call after the pass: on a GPU it runs; without one the compile-only driver refuses the launch
    of the real compiled kernel, which is as far as a launch can get here."""
    if not driver.compile_only():
        return call()
    with pytest.raises(RuntimeError, match="never loaded or launched"):
        call()
    return None


# -- flashnn ----------------------------------------------------------------------------------------------------

flashnn_utils = pytest.importorskip("flashnn.triton_kernels.triton_utils")
from flashnn.triton_kernels.fused_moe_fp16 import _fused_moe_kernel, fused_moe_fp16_forward  # noqa: E402

MOE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1}


def padded(tokens, top_k, block_m=16):
    """The rows of ``sorted_token_ids`` an engine's block alignment allocates for ``tokens``."""
    return tokens * top_k + E * (block_m - 1)


def moe_inputs(tokens, top_k):
    rows = padded(tokens, top_k)
    return {"A": torch.randn(tokens, K, dtype=torch.float16, device=device()),
            "B": torch.randn(E, N, K, dtype=torch.float16, device=device()),
            "C": torch.zeros(tokens, top_k, N, dtype=torch.float16, device=device()),
            "topk_weights": torch.rand(tokens, top_k, device=device()),
            "topk_ids": torch.randint(0, E, (tokens, top_k), dtype=torch.int32, device=device()),
            "sorted_token_ids": torch.full((rows,), tokens * top_k, dtype=torch.int32, device=device()),
            "expert_ids": torch.zeros(triton.cdiv(rows, MOE_CONFIG["BLOCK_SIZE_M"]), dtype=torch.int32,
                                      device=device()),
            "num_tokens_post_padded": torch.tensor([rows], dtype=torch.int32, device=device())}


def moe_op(top_k):
    @lists_kernels(BuildConfig(DynamicSpec("A", dim=0, name="tokens"),
                               DynamicSpec("C", dim=0, follows="tokens"),
                               DynamicSpec("topk_weights", dim=0, follows="tokens"),
                               DynamicSpec("topk_ids", dim=0, follows="tokens"),
                               DynamicSpec("sorted_token_ids", dim=0, follows=lambda d: padded(d["tokens"], top_k))),
                   output="C", name=f"fused_moe_top{top_k}")
    def fused_moe(A, B, C, topk_weights, topk_ids, sorted_token_ids, expert_ids, num_tokens_post_padded):
        fused_moe_fp16_forward(A, B, C, topk_weights, topk_ids, sorted_token_ids, expert_ids, num_tokens_post_padded,
                               True, top_k, MOE_CONFIG)
        return C
    return fused_moe


@pytest.fixture
def flashnn_cache():
    flashnn_utils.TRITON_KERNELS_CACHE.clear()
    _fused_moe_kernel.device_caches.clear()
    yield flashnn_utils.TRITON_KERNELS_CACHE
    flashnn_utils.TRITON_KERNELS_CACHE.clear()


@pytest.mark.parametrize("top_k", [1, 2])
def test_flashnn_keeps_the_kernel_a_lazy_run_of_the_rehearsed_call_would_keep(flashnn_cache, compiles, top_k):
    fused_moe = moe_op(top_k)
    with build_pass("warmup"):
        fused_moe(**moe_inputs(64, top_k))
    built = len(compiles)
    [(kernel,)] = flashnn_cache.values()  # one entry: flashnn keys on the config's constexprs alone
    assert isinstance(kernel, PendingKernel)
    resolved = kernel.resolve()
    assert isinstance(resolved, CompiledKernel) and len(compiles) == built
    # The call's own shape was replayed first, so the entry holds the kernel for 64 tokens, as a lazy run's first
    # call would have kept; the sweep's 1 token would have made num_valid_tokens a constant of 1, wrong at 64.
    valid = (_fused_moe_kernel.arg_names.index("num_valid_tokens"),)
    assert valid not in resolved.src.constants
    # A lazy run's first call at the rehearsed shape keeps the very kernel the entry resolved to (its launch made a
    # compile-only lookup here: flashnn keeps what `run` returns, launched or not).
    pending = dict(flashnn_cache)
    flashnn_cache.clear()
    with settings.scope(late_compile="error"), looking_up_only():
        fused_moe_fp16_forward(*moe_inputs(64, top_k).values(), True, top_k, MOE_CONFIG)
    assert [kept for (kept,) in flashnn_cache.values()] == [resolved] and pending.keys() == flashnn_cache.keys()
    flashnn_cache.clear()
    flashnn_cache.update(pending)
    with settings.scope(late_compile="error"):
        # flashnn's relaunch passes no constexprs, which Triton 3.6-3.7's launchers need: a second call at a key
        # fails there with or without buildops. Without a GPU the launch stops at the compile-only driver first.
        if driver.compile_only():
            reaches_the_built_kernel(lambda: fused_moe(**moe_inputs(64, top_k)))
    assert len(compiles) == built and late_compiles() == []


# -- unsloth ----------------------------------------------------------------------------------------------------

def _unsloth_triton_launch():
    spec = importlib.util.find_spec("unsloth")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("unsloth is not installed")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "kernels" / "triton_launch.py"
    module_spec = importlib.util.spec_from_file_location("unsloth_triton_launch", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


unsloth_launch = _unsloth_triton_launch()


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0), DynamicSpec("y", dim=0, follows="x.0"),
                           DynamicSpec("out", dim=0, follows="x.0")), output="out")
def add(x, y, out):
    n = x.shape[0]
    block = 1024 if n >= 1024 else 128
    unsloth_launch.launch(_add_kernel, (triton.cdiv(n, block),), (x, y, out, n), 3, {"BLOCK": block},
                          driver.active_driver().get_current_device(), num_warps=4)
    return out


@pytest.fixture
def unsloth_cache(monkeypatch):
    """unsloth's launch cache, on: a CPU build of torch has no raw CUDA stream, which turns it off there."""
    if driver.compile_only():
        monkeypatch.setattr(unsloth_launch, "_raw_stream", lambda device_index: 0)
        monkeypatch.setattr(unsloth_launch, "_ENABLED", True)
    assert unsloth_launch._ENABLED
    unsloth_launch._CACHE.clear()
    _add_kernel.device_caches.clear()
    yield unsloth_launch._CACHE
    unsloth_launch._CACHE.clear()


def test_unsloth_s_direct_launches_reach_the_kernels_the_pass_built(unsloth_cache, compiles):
    with build_pass("warmup"):
        for dtype in (torch.float16, torch.float32):
            add(*(torch.zeros(4096, dtype=dtype, device=device()) for _ in range(3)))
    built = len(compiles)
    assert built and unsloth_cache
    assert all(isinstance(compiled, PendingKernel) for compiled, _ in unsloth_cache.values())
    assert all(isinstance(compiled.resolve(), CompiledKernel) for compiled, _ in unsloth_cache.values())
    assert len(compiles) == built
    x = torch.ones(4096, dtype=torch.float16, device=device())
    entry = unsloth_cache[next(key for key in unsloth_cache if key[4][0][0] == torch.float16 and key[2] == (1024,))]
    stream_device = driver.active_driver().get_current_device()
    with settings.scope(late_compile="error"):  # unsloth's own relaunch: compiled.run(..., compiled.function, ...)
        reaches_the_built_kernel(lambda: unsloth_launch.relaunch(entry, (4,), stream_device, (x, x, x, 4096)))
    assert len(compiles) == built and late_compiles() == []
