"""A Triton build's run: compile one recorded launch (in a worker process where it can), then, on a GPU, load it.

With worker processes, a worker compiles the variant into the shared Triton cache and the warmup here is then a
disk-cache hit that puts the kernel in this process's memory. On a GPU the build also makes the kernel's launcher
and loads its module, so that the first launch pays neither compile nor load.
"""

from __future__ import annotations

import logging
import pickle
import threading
from typing import Any

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from ..._config import triton_executor
from ..._core.build import Outcome
from ..._runtime import children
from ..._runtime.forking import free_in_child
from . import entries, worker
from .driver import compile_only, inner_jit, kernel_name
from .patches import building
from .shipping import KeyMismatch, ShippedKernel, describe
from .state import triton_state
from .versions import launcher_signature, load, make_launcher, triton_key
from .worker import workers

__all__ = ["LAUNCHER_WAIT_SECONDS", "WarmupRun", "hash_triton_install"]

logger = logging.getLogger("buildops")

# How long a build waits for another thread making the launcher of its signature before it makes its own.
LAUNCHER_WAIT_SECONDS = 60.0

_triton_key_lock = free_in_child(threading.Lock())
_load_lock = free_in_child(threading.Lock())


def hash_triton_install() -> None:
    """Pay this process's one-time Triton cost now: its first compile or cache lookup hashes Triton's install
    (``triton_key``). The result is cached but its computation is not locked, so threads that get there together
    each compute it, holding the GIL; here one computes it and the others wait."""
    with _triton_key_lock:
        triton_key()


class WarmupRun:
    """A build's run: ``JITFunction.warmup`` with the recorded launch's arguments; on a GPU, also load the module.

    Its :class:`Outcome` holds the compiled kernel, whether the variant compiled (``cached`` False) or was in
    Triton's cache already (True), as the worker process or, without one, this thread's compile saw it, and where
    it compiled when not in a worker from source.
    """

    def __init__(self, jit: JITFunction, args: tuple, kwargs: dict, device: int, the_target: GPUTarget) -> None:
        self.jit, self.args, self.kwargs, self.device, self.target = jit, args, kwargs, device, the_target
        self.given_up = threading.Event()
        self._in_worker = False
        self._started: children.Started | None = None  # the processes this run's thread started, while it runs
        self.entries: set[str] = set()  # the Triton cache entries its last call opened (for the build store)
        self.in_local_cache = False  # set by the build store's sharing: its entries are in the local cache

    def _compile_in_worker(self) -> tuple[bool | None, str | None]:
        """Compile in a worker process: from the kernel's source where it travels (nothing of the user's is
        imported there), else by importing its module there; else leave it to this thread. Returns whether the
        worker compiled (None: no worker did, or it did not say) and, where it was not from source, where the
        build compiles and why (the ``Build`` contract's ``where``)."""
        label = kernel_name(self.jit)
        try:
            pickle.dumps((self.args, self.kwargs))
        except Exception:  # noqa: BLE001 - whatever stops them pickling
            return None, "this process (its launch's arguments do not travel to a worker)"
        shipped = describe(self.jit)
        if isinstance(shipped, ShippedKernel):
            try:
                return compile_shipped(label, shipped, self.args, self.kwargs, self.target, self.given_up), None
            except Exception as exc:  # this thread's own compile gives the real error, if any
                if self.given_up.is_set():
                    raise
                logger.debug("buildops: the worker's build of %s from source failed; building it in a thread",
                             label, exc_info=True)
                return None, f"this process (its source, sent to a worker, failed there: {type(exc).__name__})"
        reference = importable_reference(self.jit)
        if reference is None:
            return None, f"this process ({shipped}; nor can a worker import it)"
        try:
            compiled = compile_in_process(reference, self.args, self.kwargs, self.target, self.given_up,
                                          self.jit.cache_key)
        except KeyMismatch:  # the file changed after this process imported it: build what this one runs
            return None, "this process (a worker imported other source: the kernel's file changed since)"
        if compiled is None:
            return None, f"this process ({shipped}; nor could a worker import it)"
        return compiled, f"a worker that imported {reference[0]} ({shipped})"

    def abandon(self) -> None:
        """Given up as timed out (``Build`` contract): stop the workers if the compile is stuck in one, and kill
        the compilers this run's thread started (a ptxas that hangs), with their children."""
        self.given_up.set()
        if self._in_worker:
            workers.stop_workers()
        started = self._started
        if started is not None:
            children.kill_started(started)

    def __call__(self) -> Outcome:
        with children.building() as started, entries.collecting() as opened:
            self._started = started
            try:
                return self._build()
            finally:
                self._started = None
                self.entries = opened

    def _build(self) -> Outcome:
        compiled: bool | None = None  # by a worker process: None where none compiled it
        where: str | None = None
        if triton_executor() == "processes" and not self.in_local_cache:
            self._in_worker = True
            try:
                compiled, where = self._compile_in_worker()
            finally:
                self._in_worker = False
        # Only after the worker's compile, which did not need this process's hash of the install.
        hash_triton_install()
        with building():
            if compile_only():
                with worker.watching_compiles() as compiles:
                    kernel = worker.warmup(self.jit, self.args, self.kwargs)
                return Outcome(kernel, cached=self._cached(compiled, compiles), where=where)
            with torch.cuda.device(self.device):
                with worker.watching_compiles() as compiles:
                    kernel = worker.warmup(self.jit, self.args, self.kwargs)
                _make_launcher(kernel)
                # One load at a time: loads contending for the driver only slow each other
                # (docs/decisions/0015-launchers-once-per-signature.md).
                with _load_lock:
                    load(kernel)
            return Outcome(kernel, cached=self._cached(compiled, compiles), where=where)

    @staticmethod
    def _cached(compiled_in_worker: bool | None, compiles: list[bool | None]) -> bool | None:
        """Whether the variant was found cached: as its worker saw it, where one ran the compile (this thread then
        only loaded the worker's artifact from disk), else as this thread's compiles did."""
        if compiled_in_worker is not None:
            return not compiled_in_worker
        return worker.found_cached(compiles)


def _make_launcher(kernel: Any) -> None:
    """Make the kernel's launcher before its load, one thread per launcher signature
    (docs/decisions/0015-launchers-once-per-signature.md).

    Up to Triton 3.6 a launcher is a C module per kernel signature, which a cold cache compiles with the host
    compiler, and variants of one kernel mostly share one: the other threads wait for the one making it, then find
    it in Triton's cache. The key only decides who waits for whom, never what is built. Its load makes
    the launcher again (a cache hit) and raises there if it must, so a failure here is only logged.
    """
    try:
        lock = _launcher_lock(launcher_signature(kernel))
    except Exception:  # noqa: BLE001 - an unexpected kernel: make its launcher without waiting for others
        lock = threading.Lock()
    # Bounded: a host compiler that hangs holds up the other variants of its signature no longer than itself.
    locked = lock.acquire(timeout=LAUNCHER_WAIT_SECONDS)
    try:
        make_launcher(kernel)
    except Exception:  # see the docstring
        logger.debug("buildops: making the launcher of %s ahead of its load failed",
                     getattr(kernel, "name", kernel), exc_info=True)
    finally:
        if locked:
            lock.release()


def _launcher_lock(key: str) -> threading.Lock:
    with triton_state.launcher_locks_lock:
        return triton_state.launcher_locks.setdefault(key, threading.Lock())


def importable_reference(jit: JITFunction) -> tuple[str, str] | None:
    """``(module, qualname)`` under which a worker can import this kernel, or None (then it builds in a thread)."""
    module, qualname = jit.fn.__module__, jit.fn.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    try:
        if inner_jit(worker.resolve(module, qualname)) is not jit:
            return None
    except Exception:  # noqa: BLE001 - whatever stops a worker importing it
        return None
    return module, qualname


def compile_in_process(reference: tuple[str, str], args: tuple, kwargs: dict, the_target: GPUTarget,
                       given_up: threading.Event | None = None, expected_key: str | None = None) -> bool | None:
    """Compile in a worker process (crashes: see ``WorkerPool.run``); a kernel the worker cannot import is left to
    the calling thread's own warmup. Returns whether the worker compiled (False: it found the variant cached),
    or None where it did not say or could not import the kernel. Raises ``shipping.KeyMismatch`` (warning once
    per build) where the worker imported other source than ``expected_key`` says this process runs."""
    module, qualname = reference
    try:
        compiled = workers.run(f"{module}.{qualname}", worker.compile_variant, module, qualname, args, kwargs,
                               knobs.cache.dir, (the_target.backend, the_target.arch, the_target.warp_size),
                               expected_key, given_up=given_up)
    except (ImportError, AttributeError):
        logger.debug("buildops: worker cannot import %s.%s; building it in a thread", module, qualname,
                     exc_info=True)
        return None
    except KeyMismatch as mismatch:
        logger.warning("buildops: %s; built in this process, from the source it runs", mismatch)
        raise
    return compiled if isinstance(compiled, bool) else None


def compile_shipped(label: str, shipped: ShippedKernel, args: tuple, kwargs: dict, the_target: GPUTarget,
                    given_up: threading.Event | None = None) -> bool | None:
    """Compile a kernel that travels as source in a worker process; whether it compiled (False: it found the
    variant cached), or None where it did not say. The arguments must pickle. Raises what the worker raised
    (``shipping.KeyMismatch``: the source did not rebuild the same kernel), or ``RuntimeError`` where the build
    was given up or crashed twice."""
    compiled = workers.run(label, worker.compile_shipped, shipped, args, kwargs, knobs.cache.dir,
                           (the_target.backend, the_target.arch, the_target.warp_size), given_up=given_up)
    return compiled if isinstance(compiled, bool) else None
