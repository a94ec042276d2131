"""What runs inside a Triton build worker process: compile one kernel variant into the shared Triton cache.

Kept apart from the rest of the Triton backend, and torch-free at import, so that a worker imports only this,
Triton, and the kernel's own module. Workers never initialise a GPU: they compile for the target each build names
through a compile-only driver.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

# The target a worker compiles for until a build names its own, and that the forkserver warms up for.
_DEFAULT_BACKEND, _DEFAULT_ARCH, _DEFAULT_WARP_SIZE = "cuda", 90, 32

_target: tuple[str, int, int] | None = None  # what this process compiles for, once use_target set it
_warmed_for: tuple[str, int, int] | None = None  # the target a first compile here (or in the forkserver) was for


def start(backend: str = _DEFAULT_BACKEND, arch: int = _DEFAULT_ARCH, warp_size: int = _DEFAULT_WARP_SIZE) -> None:
    """Process initializer: compile through a compile-only driver, never touching a GPU (each build names its
    target, :func:`compile_variant`), and pay every one-time cost of a first compile (hashing Triton's install,
    loading LLVM, asking ptxas its version) before any build. A worker forked from a forkserver that ran
    :func:`warm_up_compiler` for this target has them paid and compiles nothing here, so that it takes builds at
    once (docs/decisions/0002-forkserver-preload.md)."""
    use_target(backend, arch, warp_size)
    if _warmed_for == _target:
        return
    try:
        _compile_a_small_kernel()
    except Exception:  # noqa: BLE001 - e.g. a Triton without this target's backend: the first build pays instead
        pass


def use_target(backend: str, arch: int, warp_size: int) -> None:
    """Compile for this target from now on, through a compile-only driver (a no-op if it already does). A worker
    serves one parent, so its builds name one target; a kernel compiled before a change would keep the old
    target's binder in Triton's per-device cache."""
    global _target
    if _target == (backend, arch, warp_size):
        return
    from triton.runtime.driver import driver

    from .driver import CompileOnlyDriver  # here: this module is imported by the torch-free pool

    driver.set_active(CompileOnlyDriver(backend, arch, warp_size))
    _target = (backend, arch, warp_size)


def warm_up_compiler() -> None:
    """Pay Triton's one-time costs for the default target (``cuda:90``) in a process that will fork workers."""
    global _warmed_for
    use_target(_DEFAULT_BACKEND, _DEFAULT_ARCH, _DEFAULT_WARP_SIZE)
    _compile_a_small_kernel()
    _warmed_for = _target


def _compile_a_small_kernel() -> None:
    import tempfile

    previous = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="buildops-worker-") as scratch:
        os.environ["TRITON_CACHE_DIR"] = scratch  # a real compile, not a cache hit: that is what warms
        try:
            _warm_kernel().warmup(torch_dtype("float32"), grid=(1,), BLOCK=16)
        finally:
            if previous is None:
                del os.environ["TRITON_CACHE_DIR"]
            else:
                os.environ["TRITON_CACHE_DIR"] = previous


def ready() -> int:
    """A no-op task: done once a worker has started and warmed."""
    return os.getpid()


def torch_dtype(name: str) -> Any:
    """The torch dtype called ``name``, imported here: this module is torch-free at import."""
    import torch
    return getattr(torch, name)


def _warm_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def _buildops_warm(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), tl.arange(0, BLOCK).to(tl.float32))
    return _buildops_warm


def resolve(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names (the outermost wrapper of a kernel, e.g. an Autotuner)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def compile_variant(module: str, qualname: str, args: tuple, kwargs: dict, cache_dir: str,
                    target: tuple[str, int, int]) -> float:
    """Compile one variant for ``target`` (backend, arch, warp size) into ``cache_dir``; returns the seconds it
    took. The parent then loads it from disk."""
    from .driver import inner_jit

    use_target(*target)
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    jit = inner_jit(resolve(module, qualname))
    start_time = time.perf_counter()
    jit.warmup(*args, grid=(1,), **kwargs)
    return time.perf_counter() - start_time
