"""Thin helpers for an engine's startup: named phases with their durations, the rehearse-then-load pattern, and
starting the build workers early.

    from buildops.startup import phase, rehearse_then_load, start_build_workers

    if __name__ == "__main__":         # worker processes import the main module too
        start_build_workers()          # first thing, before importing torch: workers take seconds to start

    import torch                       # and the engine's other imports

    def start_engine(config):
        with phase("create model"):
            buildops.model_configured(config)  # families that list from the config alone: before allocating
            model = Model(config)
            buildops.model_created(model, config)  # and those that need the model's modules
        rehearse_then_load(lambda: model(dummy_context_batch) and model(dummy_decode_step),
                           lambda: load_checkpoint(model))
        with phase("capture graphs"):
            capture_cuda_graphs(model)  # buildops.prepare_graph_capture() already ran

Engines keep their own loaders and runners; these only order and time the steps.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import gc
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ._config import settings, triton_executor
from ._core.passes import rehearsal
from ._runtime import gil
from ._runtime.forking import forget_in_child

__all__ = ["phase", "phases", "rehearse_then_load", "start_build_workers"]

logger = logging.getLogger("buildops")
T = TypeVar("T")

_phases: list[tuple[str, float]] = []
_lock = threading.Lock()


def start_build_workers() -> bool:
    """Start the worker processes that Triton builds compile in, where builds will use them
    (``BUILDOPS_EXECUTOR=processes``, or ``auto`` on 8 CPUs or more); returns whether it did (or had). Returns at
    once.

    Workers take seconds to be ready: a forkserver imports torch and Triton, then forks them. Without this call
    they start with the first Triton build and the first builds wait for them. This module imports no torch, so
    an engine can call this first thing, before its own imports, and the forkserver's imports run beside them.
    A short-lived process builds Triton's CUDA helper module into Triton's cache meanwhile (the driver's first
    use would build it, in the engine's thread), and once the engine has imported torch and Triton, a background
    thread hashes Triton's install (the first build needs it), with the GIL's short switch interval held
    (``BUILDOPS_SWITCH_INTERVAL_US``). None of it touches a GPU. Without Triton it does nothing. The workers run
    below this process's CPU priority (``BUILDOPS_WORKER_NICE``; a bad value raises here).

    Call it under ``if __name__ == "__main__":`` (workers import the main module as they start), and after
    setting ``TRITON_CACHE_DIR`` if the engine sets it: the helper's process takes the cache from the environment
    as it is now (where Triton's cache is elsewhere once the engine has imported it, the background thread
    builds the helper module there itself). Calling it again starts the workers if they were shut down since;
    the helper and the background thread run once per process.
    """
    global _prepared
    if importlib.util.find_spec("triton") is None or triton_executor() != "processes":
        return False
    settings.worker_nice  # noqa: B018 - a bad value raises here, at the engine's call, not on the starting thread
    from .backends.triton.pool import workers

    workers.start()  # nothing if they run: buildops.shutdown() stops them, and then this starts them again
    with _prepare_lock:
        if not _prepared:
            utils = _start_building_triton_utils()
            threading.Thread(target=_prepare_builds, args=(utils,), name="buildops-prepare", daemon=True).start()
            _prepared = True
    return True


_prepared = False  # what the helper and the background thread do lasts for the process: Triton's cache, the hash
_prepare_lock = threading.Lock()


@forget_in_child
def _forget_the_preparation() -> None:
    # A forked child has not the parent's preparation thread; its hash and cache are the parent's, but a child
    # that starts workers of its own prepares again (cheaply: both are done) rather than guess.
    global _prepared, _prepare_lock
    _prepared, _prepare_lock = False, threading.Lock()


# How long the background preparation waits for the engine to import torch and Triton before it gives up.
PREPARE_WAIT_SECONDS = 600.0


def _prepare_builds(utils: subprocess.Popen | None) -> None:
    # Only once the engine's own imports of torch and Triton are done: two threads importing torch at once can
    # fail (one of them sees a partially initialised module).
    deadline = time.monotonic() + PREPARE_WAIT_SECONDS
    while not (_imported("torch") and _imported("triton")):
        if time.monotonic() > deadline:
            if utils is not None:
                _stop(utils)
            return
        time.sleep(0.05)
    # Hashing Triton's install is Python and holds the GIL while the engine makes its model: its CUDA calls, each
    # of which hands the GIL back, would wait up to 5 ms apiece for it.
    try:
        with gil.holding():
            from .backends.triton.build import hash_triton_install

            hash_triton_install()
    except Exception:  # builds do it themselves, or fail where someone sees it (a bad setting: at the first build)
        logger.debug("buildops: hashing Triton's install in the background failed", exc_info=True)
    built_into = _helper_cache_dir(utils) if utils is not None else None  # waits, without the short interval
    try:
        from triton import knobs

        if built_into != knobs.cache.dir:  # it failed, or the engine moved Triton's cache since
            with gil.holding():
                _build_triton_utils()
    except Exception:  # the driver builds it when first used
        logger.debug("buildops: building Triton's CUDA utilities in the background failed", exc_info=True)


# How long a build of Triton's CUDA helper module may take before it is stopped (its driver then builds it).
UTILS_WAIT_SECONDS = 60.0

# The helper's process sees this process's import path (the same Triton, the same buildops), whatever
# PYTHONPATH says; it reads it from stdin (a command line has a length limit), and prints the cache it built into.
_UTILS_SCRIPT = """\
import json, sys
sys.path[:] = json.load(sys.stdin)
from buildops.startup import _build_triton_utils
raise SystemExit(_build_triton_utils(report=True))
"""


def _start_building_triton_utils() -> subprocess.Popen | None:
    """Build Triton's CUDA helper module (``cuda_utils``, C, built by the host compiler on a cold Triton cache)
    into Triton's cache, in a process of its own begun now. Triton builds it when its driver is first used, on
    the engine's main thread: 0.3-0.5 s of the tiny LLM's model creation on the H200 host, where its family
    lists before the model is allocated. This process needs only Triton (0.3 s to import), so it is done long
    before the engine has imported torch; a thread here would have to wait for those imports. It never
    initialises CUDA. It has a session of its own, so that stopping it stops the host compiler it runs too; it
    is stopped at exit if it still runs then."""
    try:
        utils = subprocess.Popen([sys.executable, "-c", _UTILS_SCRIPT], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        logger.debug("buildops: could not start building Triton's CUDA utilities ahead of use", exc_info=True)
        return None
    try:
        utils.stdin.write(json.dumps([p for p in sys.path if isinstance(p, str)]).encode())
        utils.stdin.close()
    except OSError:  # it died already: _helper_cache_dir sees its exit status
        pass
    atexit.register(_stop, utils)
    return utils


def _helper_cache_dir(utils: subprocess.Popen) -> str | None:
    """The Triton cache the helper built the module into, once it is done; None if it failed (no CUDA here?) or
    took too long (then it is stopped). Its output is one short line: waiting before reading cannot block it."""
    try:
        returncode = utils.wait(UTILS_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        _stop(utils)
        return None
    out = utils.stdout.read().decode(errors="replace").strip()
    utils.stdout.close()
    if returncode != 0 or not out:
        return None
    return out


def _stop(process: subprocess.Popen) -> None:
    """Stop ``process`` and its session (the host compiler it started too), if it still runs; reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        process.wait()
    if process.stdout is not None and not process.stdout.closed:
        process.stdout.close()


def _build_triton_utils(report: bool = False) -> int:
    """Build (or find in Triton's cache) its CUDA helper module; 0 if it is there now (with ``report``, after
    printing the cache's directory). Not through ``driver.active``, which would initialise CUDA."""
    try:
        from triton import knobs
        from triton.backends.nvidia.driver import CudaUtils

        CudaUtils()
    except Exception:  # no CUDA here, or another Triton: the driver builds it when first used
        return 1
    if report:
        print(knobs.cache.dir, flush=True)
    return 0


def _imported(name: str) -> bool:
    """Whether module ``name`` is imported and done initialising (importlib marks it while it runs)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time a startup step; logs its duration and keeps it for :func:`phases` (even if the step raises)."""
    start = time.perf_counter()
    logger.info("buildops: phase %s ...", name)
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        with _lock:
            _phases.append((name, seconds))
        logger.info("buildops: phase %s took %.2f s", name, seconds)


def phases(clear: bool = False) -> list[tuple[str, float]]:
    """The phases timed so far, in order, as (name, seconds)."""
    with _lock:
        recorded = list(_phases)
        if clear:
            _phases.clear()
    return recorded


def rehearse_then_load(rehearse: Callable[[], object], load: Callable[[], T], *, name: str = "startup",
                       overlap: bool = False, freeze_heap: bool = False) -> T:
    """Run the dummy forwards in a :func:`~buildops.rehearsal` (their builds start), load the checkpoint while the
    builds run, then wait for the GPU builds, so that what follows (CUDA graph capture, serving) never overlaps
    them, and collect the rehearsal's garbage. Returns what ``load`` returns (and raises what it raises).
    CPU-only builds may still be running; :func:`buildops.join` waits for those too.

    ``overlap=True`` starts the load on a thread at once, so that it also overlaps the rehearsal's own host work
    (listing is Python, and shares the GIL with the builds). Only for a rehearsal that reads no weight values:
    every op that reads weights returns its placeholder in the rehearsal, and nothing in between looks at them.

    ``freeze_heap=True`` ends the start with the heap frozen (``gc.freeze()``), as vLLM's engine does once it has
    started: collections while serving then walk only what serving makes. The heap is frozen as the call begins,
    so the final collection walks only what the start made rather than every object of torch's and Triton's
    (0.09 s less in a start on the GPU host, docs/benchmarks.md). The price is the engine's to weigh: nothing
    frozen is ever collected until ``gc.unfreeze()``, neither garbage left before the call nor what becomes
    garbage later (a model dropped in a reference cycle keeps its GPU memory). If the call raises, the heap is
    unfrozen again, whatever froze it: a frozen object is only a collection skipped, so unfreezing one frozen
    before costs time in collections, never a wrong one, where leaving frozen what the failed start froze could
    keep its garbage for good.
    """
    if freeze_heap:
        gc.freeze()
    try:
        loaded = _rehearse_and_load(rehearse, load, name, overlap)
        with phase(f"{name}: wait for GPU builds"):
            from .capture import GraphCaptureDuringBuild, prepare_graph_capture  # here: this module imports no torch

            try:
                prepare_graph_capture()
            except GraphCaptureDuringBuild as stuck:  # a build that hangs must not fail a start: its op compiles on
                # first use, and the capture guard still refuses a CUDA graph capture while it runs
                logger.warning("%s", stuck)
        with phase(f"{name}: collect garbage"):
            # The rehearsal's replays leave short-lived objects in reference cycles; collect them now rather than
            # in the middle of the first request. A full collection, though it walks every object torch and
            # Triton made (125-160 ms on the CPU machine, benchmarks/rehearsal_garbage.py) unless the heap was
            # frozen: the young generations alone cost next to nothing, but garbage that outlived two automatic
            # collections (through the load, the builds' completions) is in the oldest, and a full collection
            # also resets the count of promoted objects that decides when the next full one runs, in serving.
            # Collecting under the load instead, right after the rehearsal, made the load longer by about as much
            # (it holds the GIL that the loader needs between reads).
            gc.collect()
    except BaseException:
        if freeze_heap:
            gc.unfreeze()
        raise
    if freeze_heap:
        gc.freeze()
    return loaded


def _rehearse_and_load(rehearse: Callable[[], object], load: Callable[[], T], name: str, overlap: bool) -> T:
    if not overlap:
        with phase(f"{name}: rehearsal"), rehearsal(name):
            rehearse()
        with phase(f"{name}: load"):
            return load()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="buildops-load") as loader:
        with phase(f"{name}: load"):
            loading = loader.submit(load)
            try:
                with phase(f"{name}: rehearsal"), rehearsal(name):
                    rehearse()
            except BaseException:
                # The load writes into the model: it ends before the caller sees the rehearsal's error, and an
                # error of its own is logged, not lost behind the one raised.
                failed = loading.exception()
                if failed is not None:
                    logger.error("buildops: %s: the load failed too, beside the failed rehearsal", name,
                                 exc_info=failed)
                raise
            return loading.result()
