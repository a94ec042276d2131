"""Triton's build worker processes: the pool (:data:`workers`), and what runs inside a worker: compile one kernel
variant into the shared Triton cache.

Kept apart from the rest of the Triton backend, and torch-free at import, so that a worker imports only this and
Triton (and ``startup.start_build_workers()`` can start the pool before the engine imports torch): a kernel comes
as source (:mod:`.shipping`), or, where it cannot, by its module's name. Workers never initialise a GPU: they
compile for the target each build names through a compile-only driver.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

from ..._config import settings
from ..._runtime.patching import Patch
from ..._runtime.pools import WorkerPool
from .state import triton_state

logger = logging.getLogger("buildops")

# The target a worker compiles for until a build names its own, and that the forkserver warms up for.
_DEFAULT_BACKEND, _DEFAULT_ARCH, _DEFAULT_WARP_SIZE = "cuda", 90, 32


def start(backend: str = _DEFAULT_BACKEND, arch: int = _DEFAULT_ARCH, warp_size: int = _DEFAULT_WARP_SIZE) -> None:
    """Process initializer: compile through a compile-only driver, never touching a GPU (each build names its
    target, :func:`compile_variant`), and pay every one-time cost of a first compile (hashing Triton's install,
    loading LLVM, asking ptxas its version) before any build. A worker forked from a forkserver that ran
    :func:`warm_up_compiler` for this target has them paid and compiles nothing here, so that it takes builds at
    once (docs/decisions/0002-forkserver-preload.md)."""
    _quiet_notices()
    use_target(backend, arch, warp_size)
    if triton_state.warmed_for == triton_state.worker_target:
        return
    try:
        _compile_a_small_kernel()
    except Exception:  # noqa: BLE001 - e.g. a Triton without this target's backend: the first build pays instead
        pass


def use_target(backend: str, arch: int, warp_size: int) -> None:
    """Compile for this target from now on, through a compile-only driver (a no-op if it already does). A worker
    serves one parent, so its builds name one target; a kernel compiled before a change would keep the old
    target's binder in Triton's per-device cache."""
    if triton_state.worker_target == (backend, arch, warp_size):
        return
    from triton.runtime.driver import driver

    from .driver import CompileOnlyDriver  # here: this module is imported by the torch-free pool

    driver.set_active(CompileOnlyDriver(backend, arch, warp_size))
    triton_state.worker_target = (backend, arch, warp_size)


def warm_up_compiler() -> None:
    """Pay Triton's one-time costs for the default target (``cuda:90``) in a process that will fork workers."""
    _quiet_notices()
    use_target(_DEFAULT_BACKEND, _DEFAULT_ARCH, _DEFAULT_WARP_SIZE)
    _compile_a_small_kernel()
    triton_state.warmed_for = triton_state.worker_target


def _quiet_notices() -> None:
    """Silence, in a worker, the notices Triton gives once per process about the engine's own settings (3.9: that
    ``TRITON_DEFAULT_FP_FUSION`` is unset): the engine gets its own once, as without buildops; each worker's copy
    would repeat it once per worker."""
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION is unset", category=UserWarning)


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
                    target: tuple[str, int, int], expected_key: str | None = None) -> bool | None:
    """Compile one variant of the kernel ``module.qualname`` (imported here) for ``target`` (backend, arch, warp
    size) into ``cache_dir``. Returns whether it compiled: False where the variant was in Triton's cache already
    (on disk, or in this worker's memory), None where Triton does not say. The parent then loads it from disk.
    Raises ``shipping.KeyMismatch``, compiling nothing, where the kernel imported here hashes otherwise than
    ``expected_key`` (its file changed since the parent, or the manifest, read it)."""
    from .driver import inner_jit
    from .shipping import KeyMismatch

    jit = inner_jit(resolve(module, qualname))
    if expected_key is not None and jit.cache_key != expected_key:
        raise KeyMismatch(f"{module}.{qualname}: its source here hashes {jit.cache_key[:16]}..., the kernel it was "
                          f"listed from {expected_key[:16]}...: its file changed since")
    return _compile(jit, args, kwargs, cache_dir, target)


def compile_shipped(shipped: Any, args: tuple, kwargs: dict, cache_dir: str,
                    target: tuple[str, int, int]) -> bool | None:
    """As :func:`compile_variant`, for a kernel that travelled as source (``shipping.ShippedKernel``): nothing of
    the user's is imported. Raises ``shipping.KeyMismatch`` where the rebuilt kernel's cache key is not the
    parent's, before compiling anything."""
    from .shipping import rebuild

    use_target(*target)  # before rebuilding: Triton's binder is made per device of the active driver
    return _compile(rebuild(shipped), args, kwargs, cache_dir, target)


def _compile(jit: Any, args: tuple, kwargs: dict, cache_dir: str, target: tuple[str, int, int]) -> bool | None:
    use_target(*target)
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    with watching_compiles() as compiles:
        warmup(jit, args, kwargs)
    cached = found_cached(compiles)
    return None if cached is None else not cached


def warmup(jit: Any, args: tuple, kwargs: dict) -> Any:
    """``jit.warmup`` of one variant. Called within :func:`watching_compiles`, where its cache entry is checked
    (:mod:`.artifacts`): a bad entry found is compiled again; one that a compile left bad is deleted and built
    once more. Raises ``artifacts.BadCacheEntry`` where the second is bad too."""
    from .artifacts import BadCacheEntry

    try:
        return jit.warmup(*args, grid=(1,), **kwargs)
    except BadCacheEntry as bad:
        logger.warning("buildops: %s; building it once more", bad)
        first = bad
    try:
        return jit.warmup(*args, grid=(1,), **kwargs)
    except BadCacheEntry as again:
        raise BadCacheEntry(again.kernel, again.path, again.problem, again=True) from first


# -- whether a build compiled or found its artifact cached ----------------------------------------------------

class _CompileListener:
    """buildops' ``knobs.compilation.listener``: calls the listener it replaced, then notes ``cache_hit`` for
    the thread watching its compiles (:func:`watching_compiles`), if this is one, and checks the cache entry
    that thread's compile has just written (``artifacts.check_new_entry``)."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, **kwargs: Any) -> None:
        if self.previous is not None:
            self.previous(**kwargs)
        compiles = getattr(triton_state.watched_compiles, "compiles", None)
        if compiles is not None:
            hit = kwargs.get("cache_hit")
            compiles.append(hit if isinstance(hit, bool) else None)
            group = kwargs.get("metadata_group")
            if hit is False and isinstance(group, dict):
                from .artifacts import check_new_entry

                check_new_entry(group)  # raises before Triton keeps the kernel in memory


@functools.cache
def _listener_patch() -> Patch | None:
    """The patch of Triton's compilation listener (made on first use: this module imports no Triton at import),
    or None where this Triton has no such knob."""
    from triton import knobs

    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return None
    return Patch(compilation, "listener", _CompileListener,
                 "Triton 3.6-3.7 tell whether a compile found its artifact in the cache only to the process-wide "
                 "knobs.compilation.listener: buildops' listener, installed while builds compile, notes it for "
                 "the building thread and calls the listener it replaced")


@contextlib.contextmanager
def watching_compiles() -> Iterator[list[bool | None]]:
    """Within the block, each Triton compile this thread runs appends to the yielded list whether it found its
    artifact in Triton's disk cache (True), compiled (False), or None where Triton does not say. A kernel found
    in the ``JITFunction``'s memory reaches no compile and appends nothing. Other threads are not watched.
    Within it, this thread's cache hits and compiles check their entry (:mod:`.artifacts`)."""
    from .artifacts import group_patch

    patch = _listener_patch()
    compiles: list[bool | None] = [] if patch is not None else [None]  # no listener: unknown
    outer = getattr(triton_state.watched_compiles, "compiles", None)
    triton_state.watched_compiles.compiles = compiles
    group = group_patch(_watching)
    group.acquire()
    if patch is not None:
        patch.acquire()
    try:
        yield compiles
    finally:
        if patch is not None:
            patch.release()
        group.release()
        triton_state.watched_compiles.compiles = outer


def _watching() -> bool:
    """Whether this thread is in a :func:`watching_compiles` block."""
    return getattr(triton_state.watched_compiles, "compiles", None) is not None


def found_cached(compiles: list[bool | None]) -> bool | None:
    """What a watched block's compiles say of a build (the ``Build`` contract's ``cached``): False if one
    compiled, True if all found their artifact cached (none at all: it was in memory), None if one cannot say."""
    if False in compiles:
        return False
    return None if None in compiles else True


def prebuild(kernel: Any, args: tuple, kwargs: dict, cache_dir: str, target: tuple[str, int, int],
             expected_key: str | None = None) -> tuple[bool | None, list[str]]:
    """Compile one variant of a manifest's entry (``buildops prebuild``): ``kernel`` is a ``shipping.ShippedKernel``
    or a ``(module, qualname)`` to import. Returns whether it compiled (as :func:`compile_variant`) and the names
    of the Triton cache entries it used, which the parent shares through the build store."""
    from .entries import collecting

    use_target(*target)
    with collecting() as used:
        if isinstance(kernel, tuple):
            module, qualname = kernel
            compiled = compile_variant(module, qualname, args, kwargs, cache_dir, target, expected_key)
        else:
            compiled = compile_shipped(kernel, args, kwargs, cache_dir, target)
    return compiled, sorted(used)


# -- the pool ----------------------------------------------------------------------------------------------------

# What the forkserver that forks the workers imports, in order: Triton, with its install's hash begun on a thread;
# then torch, meanwhile, and a first compile once that hash is done. Never the main module: the pool keeps it out of
# the forkserver's list and out of what each worker is told to import, so a script's module-level code runs once.
FORKSERVER_PRELOAD_FIRST = ("buildops.backends.triton.preload",)
FORKSERVER_PRELOAD = ("buildops.backends.triton.warm",)

# Workers learn the target with each build, not when they start: starting them (maybe before the engine picked its
# GPU) must not initialise CUDA in this process, which asking for the target does.
workers = WorkerPool("Triton build", lambda: settings.threads, start, warm_up=ready,
                     preload=FORKSERVER_PRELOAD, preload_first=FORKSERVER_PRELOAD_FIRST)
