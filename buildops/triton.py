"""Compile-only Triton builds, listing by replay, and late-compile detection.

Imported only when Triton is used: by a lister that calls :func:`triton_builds`, by an op listed by replay, or at
the end of a pass when ``triton`` is already imported (to watch for late compiles).

How a build stays exact: a build is recorded where the real launch would happen, at the innermost
``JITFunction.run``, with the arguments and keyword options the launch passes (after ``@triton.autotune`` and
``@triton.heuristics`` have added theirs, in the same order, since Triton's in-memory key depends on it). The
build replays that call as ``JITFunction.warmup`` on a worker, with every tensor replaced by a stand-in that has
the tensor's dtype and pointer alignment (so integers equal to 1, multiples of 16 and aligned pointers specialize
as they would). The real launch then finds the kernel in Triton's cache and compiles nothing.

Interception (``JITFunction.run`` and ``Autotuner.run`` replaced by recording versions) is installed only while a
recording is active, and even then it records only on the thread (context) that records: elsewhere, Triton runs
as without buildops.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.autotuner import Autotuner
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction, compute_cache_key

from . import _late, _triton_worker
from ._builder import Build, current_builder, on_builder_thread
from ._config import settings, triton_executor
from ._gpu import run_admitted
from ._triton_pool import workers as _processes
from ._specs import TensorSpec

__all__ = ["CompileOnlyDriver", "PointerArg", "recording", "target", "triton_builds"]

logger = logging.getLogger("buildops")


# -- a driver for machines without a GPU ----------------------------------------------------------------------

class CompileOnlyDriver(DriverBase):
    """A Triton driver that compiles for a fixed target and refuses to load or launch: for machines without a GPU.

    buildops installs it only when Triton finds no driver (``0 active drivers``); the target comes from
    ``BUILDOPS_TRITON_TARGET`` (default ``cuda:90``).
    """

    def __init__(self, backend: str, arch: int) -> None:
        super().__init__()
        self.target = GPUTarget(backend, arch, 32 if backend == "cuda" else 64)

    @classmethod
    def is_active(cls) -> bool:
        return False  # never picked by Triton's own driver discovery

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("compile-only driver")

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return divmod(self.target.arch, 10)

    def get_benchmarker(self):
        raise RuntimeError("buildops compile-only Triton driver: there is no GPU to benchmark on")

    @property
    def utils(self):
        raise RuntimeError("buildops compile-only Triton driver: kernels are compiled here, never loaded or launched")

    @property
    def launcher_cls(self):
        raise RuntimeError("buildops compile-only Triton driver: kernels are compiled here, never loaded or launched")


_driver_lock = threading.Lock()


def target() -> GPUTarget:
    """The target Triton compiles for here: the current GPU's, or ``BUILDOPS_TRITON_TARGET`` without a GPU."""
    try:
        return driver.active.get_current_target()
    except RuntimeError:  # "0 active drivers": no GPU here
        with _driver_lock:
            try:
                return driver.active.get_current_target()
            except RuntimeError:
                backend, arch = settings.triton_target
                driver.set_active(CompileOnlyDriver(backend, arch))
                logger.info("buildops: no GPU driver; Triton builds compile for %s:%d", backend, arch)
                return driver.active.get_current_target()


def _compile_only() -> bool:
    return isinstance(driver.active, CompileOnlyDriver)


# -- stand-ins for tensors ------------------------------------------------------------------------------------

class PointerArg:
    """What Triton's specialization reads of a tensor argument (its dtype and pointer alignment), without memory."""

    __slots__ = ("dtype", "aligned")

    def __init__(self, dtype: torch.dtype, aligned: bool = True) -> None:
        self.dtype = dtype
        self.aligned = aligned

    def data_ptr(self) -> int:
        return 0 if self.aligned else 8  # Triton specializes on data_ptr() % 16

    def __repr__(self) -> str:
        return f"PointerArg({self.dtype}, aligned={self.aligned})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PointerArg) and (self.dtype, self.aligned) == (other.dtype, other.aligned)

    def __hash__(self) -> int:
        return hash((self.dtype, self.aligned))

    def __reduce__(self):
        return PointerArg, (self.dtype, self.aligned)


def _stand_in(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        if isinstance(arg, FakeTensor) or arg.device.type == "meta":  # allocations are aligned: the offset decides
            pointer = arg.storage_offset() * arg.element_size()
        else:
            pointer = arg.data_ptr()
        return PointerArg(arg.dtype, pointer % 16 == 0)
    if isinstance(arg, TensorSpec):
        return PointerArg(arg.dtype, True)
    if isinstance(arg, torch.dtype):
        return PointerArg(arg, True)
    if isinstance(arg, tuple):
        return tuple(_stand_in(a) for a in arg)
    return arg


def _inner_jit(kernel: Any) -> JITFunction:
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def _kernel_name(jit: JITFunction) -> str:
    return f"{jit.fn.__module__}.{jit.fn.__qualname__}"


def _launch_key(jit: JITFunction, args: tuple, kwargs: dict) -> str:
    """The key ``JITFunction.run`` will look up for this launch (mirrors its preprocessing; 3.6 and 3.7)."""
    options = dict(kwargs)
    options["debug"] = options.get("debug", jit.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = jit.device_caches[driver.active.get_current_device()][4]
    _, specialization, options = binder(*args, **options)
    stages_hook = getattr(knobs.runtime, "add_stages_inspection_hook", None)
    if stages_hook is not None:
        specialization.append(f'("custom_pipeline", {stages_hook()[1]})')
    return compute_cache_key({}, specialization, options)


# -- recording launches ---------------------------------------------------------------------------------------

class _Recording:
    def __init__(self, op: str) -> None:
        self.op = op
        self.builds: list[Build] = []

    def add(self, jit: JITFunction, args: tuple, kwargs: dict) -> None:
        stand_ins = tuple(_stand_in(a) for a in args)
        kwargs = {k: _stand_in(v) for k, v in kwargs.items()}
        the_target = target()
        device = driver.active.get_current_device()
        key = ("triton", _kernel_name(jit), jit.cache_key, _launch_key(jit, stand_ins, kwargs), the_target)
        options = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        label = f"{jit.fn.__name__}[{options}]" if options else jit.fn.__name__
        _note_listed(_kernel_name(jit), self.op)
        # On a GPU the build also loads the module: GPU work, which graph capture must not overlap.
        run = _WarmupRun(jit, stand_ins, kwargs, device, the_target)
        self.builds.append(Build(self.op, key, run, uses_gpu=not _compile_only(), label=label, library="triton"))


class _WarmupRun:
    """A build's run: ``JITFunction.warmup`` with the recorded launch's arguments; on a GPU, also load the module.

    With worker processes, a process compiles the variant into the shared Triton cache first, and the warmup
    here is then a disk-cache hit (about a millisecond) that puts the kernel in this process's memory.
    """

    def __init__(self, jit: JITFunction, args: tuple, kwargs: dict, device: int, the_target: GPUTarget) -> None:
        self.jit, self.args, self.kwargs, self.device, self.target = jit, args, kwargs, device, the_target
        self.given_up = threading.Event()
        self._in_worker = False

    def abandon(self) -> None:
        """Given up as timed out (``Build`` contract): stop the workers if the compile is stuck in one."""
        self.given_up.set()
        if self._in_worker:
            _processes.stop_workers()

    def __call__(self) -> Any:
        if triton_executor() == "processes":
            reference = _picklable_reference(self.jit, self.args, self.kwargs)
            if reference is not None:
                self._in_worker = True
                try:
                    _compile_in_process(reference, self.args, self.kwargs, self.target, self.given_up)
                finally:
                    self._in_worker = False
        # Only now: the warmup here needs Triton's install hashed, the worker's compile did not, and the first
        # builds of a start used to wait for the hashing (0.3-0.4 s on the GPU host) before they reached a worker.
        hash_triton_install()
        if _compile_only():
            return self.jit.warmup(*self.args, grid=(1,), **self.kwargs)
        with torch.cuda.device(self.device):
            kernel = self.jit.warmup(*self.args, grid=(1,), **self.kwargs)
            _make_launcher(kernel)
            # Load the module now, so the first launch pays neither compile nor load. One load at a time: the
            # driver serializes them anyway, and 16 threads contending for it measured 2-5x slower in all.
            with _load_lock:
                kernel._init_handles()
        return kernel


def _make_launcher(kernel: Any) -> None:
    """Make the kernel's launcher before the load lock is taken. Up to Triton 3.6 a launcher is a C module per
    kernel signature that a cold cache compiles with the host compiler (0.2-0.3 s on the GPU host): under the
    lock, that held up every other load. Since 3.7 it is generic and this costs microseconds. ``_init_handles``
    makes it again, a cache hit now, and raises there if it must.

    Variants of one kernel mostly share a launcher: builder threads that reached it together each compiled it (20
    host compiles in a start of the tiny LLM, for 9 launchers; 2.5 s of CPU beside its load).
    One thread per signature makes it; the others wait, then find it in Triton's cache. The key only decides who
    waits for whom, never what is built, so a key that misses a difference Triton's launcher source makes merely
    serializes two launchers."""
    try:
        lock = _launcher_lock(_launcher_key(kernel))
    except Exception:  # noqa: BLE001 - an unexpected kernel: make its launcher without waiting for others
        lock = threading.Lock()
    # Bounded: a host compiler that hangs must hold up the other variants of its signature no longer than it
    # would have held each of them; past the bound, each makes the launcher itself, as without the lock.
    locked = lock.acquire(timeout=LAUNCHER_WAIT_SECONDS)
    try:
        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 - see the docstring
        logger.debug("buildops: making the launcher of %s ahead of its load failed",
                     getattr(kernel, "name", kernel), exc_info=True)
    finally:
        if locked:
            lock.release()


# How long a build waits for another thread making the launcher of its signature before it makes its own.
LAUNCHER_WAIT_SECONDS = 60.0


def _launcher_key(kernel: Any) -> str:
    """What a launcher's C source depends on, from the signature's values (the argument names, its keys, are not
    in the source): the scalar types, and which arguments are pointers, whatever they point to (Triton 3.6 passes
    every pointer alike); whether each tensor descriptor has metadata. Not the constants that tell one variant from
    another."""
    def kind(arg_type: Any) -> Any:
        if isinstance(arg_type, tuple):
            return tuple(kind(t) for t in arg_type)
        return "*" if isinstance(arg_type, str) and arg_type.startswith("*") else arg_type
    signature = getattr(getattr(kernel, "src", None), "signature", None) or {}
    descriptors = getattr(kernel.metadata, "tensordesc_meta", None)
    return repr((tuple(kind(t) for t in signature.values()),
                 None if descriptors is None else tuple(m is None for m in descriptors)))


def _launcher_lock(key: str) -> threading.Lock:
    with _launcher_locks_lock:
        return _launcher_locks.setdefault(key, threading.Lock())


_launcher_locks: dict[str, threading.Lock] = {}
_launcher_locks_lock = threading.Lock()
_load_lock = threading.Lock()


# Python up to 3.12 keeps ast.parse's count of its recursion depth in state that every thread shares: a thread that
# hands the GIL over mid-parse (a garbage collection running a __del__) lets another one parse, and one of them
# fails with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). Triton parses a
# kernel's source at every compile, so builder threads compiling at once failed builds that way (once on the
# 2-core CI machine). One parse at a time; a parse takes about a millisecond.
_parse_lock = threading.RLock()
_original_parse = getattr(JITFunction, "parse", None)


def _parse_one_at_a_time(self: JITFunction) -> Any:
    with _parse_lock:
        return _original_parse(self)


if _original_parse is not None:
    JITFunction.parse = _parse_one_at_a_time


# Triton loads the helper modules it compiles (up to 3.6, one C launcher per kernel signature) each from a file of
# its own but all under one module name, "__triton_launcher". CPython keeps a single-phase extension module in
# sys.modules under its name, and loading such a file a second time (a launcher made again, or one that variants
# share) fills the module it finds there with the file's functions: that of another signature, loaded last. A
# thread that had just loaded that one, and had not yet read its ``launch``, took the other's: a start of the tiny
# LLM failed at its first request with "TypeError: function takes exactly 23 arguments (18 given)" (builder
# threads making launchers at once, on the GPU host). Loaded one at a time, and out of sys.modules once loaded, a
# module Triton holds is beyond the reach of any later load.
_module_load_lock = threading.Lock()
try:
    from triton.runtime import build as _triton_build

    _original_load_module = _triton_build._load_module_from_path
except (ImportError, AttributeError):  # another Triton: its loads stay as they are
    _original_load_module = None


def _load_module_alone(name: str, path: str) -> Any:
    with _module_load_lock:
        module = _original_load_module(name, path)
        if sys.modules.get(name) is module:
            del sys.modules[name]
    return module


if _original_load_module is not None:
    _triton_build._load_module_from_path = _load_module_alone


# -- worker processes -----------------------------------------------------------------------------------------

try:
    from triton.runtime.cache import triton_key as _triton_key
except ImportError:  # moved in another Triton version: each process computes it once, perhaps on several threads
    def _triton_key() -> str:
        return ""

_triton_key_lock = threading.Lock()


def _new_locks_after_fork() -> None:
    # A forked child has none of this process's threads: a lock that one of them held would stay held there.
    global _load_lock, _triton_key_lock, _launcher_locks, _launcher_locks_lock, _driver_lock, _patch_lock
    global _listed_lock, _parse_lock, _module_load_lock
    _load_lock, _triton_key_lock, _module_load_lock = threading.Lock(), threading.Lock(), threading.Lock()
    _launcher_locks, _launcher_locks_lock = {}, threading.Lock()
    _driver_lock, _patch_lock, _listed_lock = threading.Lock(), threading.Lock(), threading.Lock()
    _parse_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_after_fork)


def hash_triton_install() -> None:
    """Pay this process's one-time Triton cost now: its first compile or cache lookup hashes Triton's install
    (``triton_key``: its sources and libtriton). The result is cached, but the computation is not locked, so
    builder threads that got there together each computed it, holding the GIL: a third of the builder threads'
    time in a profile of the tiny LLM's startup, and the rehearsal and the autotuning beside them starved. Here
    one computes it and the others wait."""
    with _triton_key_lock:
        _triton_key()


def _picklable_reference(jit: JITFunction, args: tuple, kwargs: dict) -> tuple[str, str] | None:
    """``(module, qualname)`` under which a worker can import this kernel, or None (then it builds in a thread)."""
    module, qualname = jit.fn.__module__, jit.fn.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    from ._triton_worker import resolve
    try:
        if _inner_jit(resolve(module, qualname)) is not jit:
            return None
        pickle.dumps((args, kwargs))
    except Exception:
        return None
    return module, qualname


def _compile_in_process(reference: tuple[str, str], args: tuple, kwargs: dict, the_target: GPUTarget,
                        given_up: threading.Event | None = None) -> None:
    """Compile in a worker process (crashes: see ``WorkerPool.run``); a kernel the worker cannot import is left to
    the calling thread's own warmup."""
    module, qualname = reference
    try:
        _processes.run(f"{module}.{qualname}", _triton_worker.compile_variant, module, qualname, args, kwargs,
                       knobs.cache.dir, (the_target.backend, the_target.arch, the_target.warp_size),
                       given_up=given_up)
    except (ImportError, AttributeError):
        logger.debug("buildops: worker cannot import %s.%s; building it in a thread", module, qualname,
                     exc_info=True)


_recording_var: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar("buildops_triton", default=None)
_patch_lock = threading.Lock()
_patch_users = 0
_original_jit_run = JITFunction.run
_original_autotuner_run = Autotuner.run


def _recording_jit_run(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
    recording = _recording_var.get()
    if recording is None:
        return _original_jit_run(self, *args, grid=grid, warmup=warmup, **kwargs)
    recording.add(self, args, kwargs)
    return None


def _recording_autotuner_run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
    recording = _recording_var.get()
    if recording is None:
        return _original_autotuner_run(self, *args, **kwargs)
    first = len(recording.builds)
    for config in _configs_to_build(self, args, kwargs):  # every config, no benchmark: each is a build
        self.fn.run(*args, **kwargs, **config.all_kwargs())
    tune = _tune_build(recording.op, self, args, kwargs, [b.key for b in recording.builds[first:]])
    if tune is not None:
        recording.builds.append(tune)
    return None


def _configs_to_build(tuner: Autotuner, args: tuple, kwargs: dict) -> list:
    """The tuner's configs after its own early pruning (data-independent by contract), without its perf model."""
    if len(tuner.configs) <= 1 or not tuner.early_config_prune:
        return list(tuner.configs)
    try:
        return list(tuner.early_config_prune(tuner.configs, dict(zip(tuner.arg_names, args)), **kwargs))
    except Exception:  # pruning that needs real data: build every config, which is never wrong, only more
        logger.debug("buildops: early_config_prune of %s failed on stand-ins; building every config",
                     tuner.base_fn.__name__, exc_info=True)
        return list(tuner.configs)


# -- autotuning in the build ----------------------------------------------------------------------------------

class _Layout:
    """What it takes to allocate a stand-in for a tensor argument: shape, strides, offset, storage size, dtype."""

    __slots__ = ("shape", "stride", "offset", "storage", "dtype")

    def __init__(self, tensor: Any) -> None:
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        if isinstance(tensor, TensorSpec):
            self.stride, self.offset, self.storage = tensor.stride(), 0, tensor.numel()
        else:
            self.stride, self.offset = tuple(tensor.stride()), tensor.storage_offset()
            self.storage = tensor.untyped_storage().nbytes() // tensor.element_size()

    @property
    def nbytes(self) -> int:
        return self.storage * self.dtype.itemsize

    def zeros(self, device: torch.device) -> torch.Tensor:
        storage = torch.zeros(self.storage, dtype=self.dtype, device=device)
        return storage.as_strided(self.shape, self.stride, self.offset)


def _tuner_key(tuner: Autotuner, args: tuple, kwargs: dict) -> tuple:
    """The key ``Autotuner.run`` files its choice under (its own computation: the key arguments, then dtypes)."""
    named = {k: v for k, v in {**dict(zip(tuner.arg_names, args)), **kwargs}.items() if k in tuner.arg_names}
    return tuple([named[k] for k in tuner.keys if k in named] +
                 [str(v.dtype) for v in named.values() if hasattr(v, "dtype")])


def _tune_build(op: str, tuner: Autotuner, args: tuple, kwargs: dict, compiles: list) -> Build | None:
    """The build that runs this launch's autotuning, or None where it cannot run here: no GPU, one config,
    ``BUILDOPS_AUTOTUNE=0``, or a tensor argument known only by its dtype (no shape to allocate)."""
    if len(tuner.configs) <= 1 or _compile_only() or not settings.autotune:
        return None
    if any(isinstance(a, (torch.dtype, PointerArg)) for a in (*args, *kwargs.values())):
        return None
    def layout(value: Any) -> Any:
        return _Layout(value) if isinstance(value, (torch.Tensor, TensorSpec)) else value

    key = _tuner_key(tuner, args, kwargs)
    layouts = tuple(map(layout, args))
    kwargs = {name: layout(value) for name, value in kwargs.items()}
    jit = _inner_jit(tuner)
    return Build(op, ("triton-autotune", _kernel_name(jit), jit.cache_key, key, target()),
                 _TuneRun(tuner, layouts, kwargs, compiles, torch.device("cuda", driver.active.get_current_device())),
                 uses_gpu=True,
                 label=f"autotune {jit.fn.__name__}{list(key)}", shared=False, serial=True, after=tuple(compiles))


class _TuneRun:
    """A build's run for an autotuned launch on a GPU: the tuner's own ``run`` on zero-filled operands of the
    launch's shapes, so that its in-memory cache holds a choice for the launch's key and the first real call
    times nothing. Timings on zeros are what they are for GEMM-like kernels; a kernel whose speed depends on
    its data should not be tuned this way (``BUILDOPS_AUTOTUNE=0``).

    It runs on the builder's serial worker (``serial=True``): one tune at a time, since tunes running together
    would time each other, and never holding a compile worker. The worker runs it once its configs' compile
    builds are done (``after``), and meanwhile tunes whose compiles are; the run itself waits for them only
    briefly. A compile that did not finish in time is left to the tuner, which compiles what it lacks. With the
    tuner's ``cache_results``, Triton keeps the choice on disk and a restart times nothing.
    """

    def __init__(self, tuner: Autotuner, layouts: tuple, kwargs: dict, compiles: list, device: torch.device) -> None:
        self.tuner, self.layouts, self.kwargs, self.compiles = tuner, layouts, kwargs, compiles
        self.device = device
        self.waited = 0.0

    def __call__(self) -> Any:
        builder = current_builder()  # None when a test runs the build by hand: nothing to wait for
        futures = (builder.future(k) for k in self.compiles) if builder is not None else ()
        compiles = [f for f in futures if f is not None]
        waiting = time.perf_counter()
        concurrent.futures.wait(compiles, timeout=COMPILE_WAIT_SECONDS)
        self.waited = time.perf_counter() - waiting  # of the build's seconds, those spent on others' compiles
        tensors = [a for a in (*self.layouts, *self.kwargs.values()) if isinstance(a, _Layout)]

        def real(value: Any) -> Any:
            return value.zeros(self.device) if isinstance(value, _Layout) else value

        def make() -> tuple:
            return tuple(map(real, self.layouts)), {name: real(value) for name, value in self.kwargs.items()}

        chosen = []

        def tune(operands: tuple) -> None:
            args, kwargs = operands
            _original_autotuner_run(self.tuner, *args, **kwargs)
            chosen.append(self.tuner.best_config)

        # Its CUDA calls each hand the GIL back: the builder's short switch interval (``_gil``) gets it back soon.
        run_admitted(self.device, sum(t.nbytes for t in tensors), make, tune,
                     f"autotuning of {self.tuner.base_fn.__name__}")
        return chosen[0]


# The builder's serial worker already waited for the tune's compiles (``Build.after``, up to the builder's
# ``AFTER_WAIT_SECONDS``): the run only waits for futures that are still being given their result.
COMPILE_WAIT_SECONDS = 1.0


@contextlib.contextmanager
def recording(op: str) -> Iterator[list[Build]]:
    """Within the block, Triton launches on this thread become builds (appended to the yielded list) instead of
    compiles and launches. Other threads launch as usual."""
    global _patch_users
    target()  # make sure a driver exists, so the binder can specialize
    with _patch_lock:
        if _patch_users == 0:
            JITFunction.run = _recording_jit_run
            Autotuner.run = _recording_autotuner_run
        _patch_users += 1
    recording_ = _Recording(op)
    token = _recording_var.set(recording_)
    try:
        yield recording_.builds
    finally:
        _recording_var.reset(token)
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                JITFunction.run = _original_jit_run
                Autotuner.run = _original_autotuner_run


def triton_builds(op: str, kernel: Any, *args: Any, **kwargs: Any) -> list[Build]:
    """The builds a launch ``kernel[grid](*args, **kwargs)`` needs, without compiling or launching anything.

    ``kernel`` is a ``@triton.jit`` function, possibly under ``@triton.autotune`` (one build per config left after
    the tuner's early pruning) and ``@triton.heuristics`` (applied as at launch). Tensor arguments may be real or
    fake tensors, :class:`~buildops.TensorSpec`, or torch dtypes. Pass the keyword options (``num_warps``, ...)
    exactly as the real launch does, in the same order: Triton's cache key depends on them.
    """
    with recording(op) as builds:
        kernel.run(*args, grid=(1,), warmup=False, **kwargs)
    return builds


# -- late compiles --------------------------------------------------------------------------------------------

_listed: dict[str, set[str]] = {}
_listed_lock = threading.Lock()


def _note_listed(kernel: str, op: str) -> None:
    with _listed_lock:
        _listed.setdefault(kernel, set()).add(op)


def forget_listed() -> None:
    """Forget which ops listed which kernels (``buildops.testing.reset``)."""
    with _listed_lock:
        _listed.clear()


def _late_compile_hook(previous):
    def hook(**kwargs: Any) -> Any:
        result = previous(**kwargs) if previous is not None else None
        if on_builder_thread() or _recording_var.get() is not None:
            return result
        fn, compiled = kwargs["fn"], kwargs.get("compile") or {}
        name = f"{fn.module}.{fn.name}"
        variant = (f"signature={compiled.get('signature')} constants={compiled.get('constants')} "
                   f"num_warps={compiled.get('num_warps')} num_stages={compiled.get('num_stages')}")
        with _listed_lock:
            ops = tuple(sorted(_listed.get(name, ())))
        _late.record(_late.LateCompile("triton", name, variant, ops, _late.caller()), (name, kwargs.get("key")))
        return result
    hook.buildops = True
    return hook


def watch_late_compiles() -> None:
    """Install buildops' ``jit_post_compile_hook`` (keeping any hook already set, which it calls first)."""
    current = knobs.runtime.jit_post_compile_hook
    if not getattr(current, "buildops", False):
        knobs.runtime.jit_post_compile_hook = _late_compile_hook(current)


_late.add_watcher(watch_late_compiles)
