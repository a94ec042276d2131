"""Thin helpers for an engine's startup: named phases with their durations, the rehearse-then-load pattern, and
starting the build workers early.

    from buildops.startup import phase, rehearse_then_load, start_build_workers

    start_build_workers()              # first thing, before importing torch: workers take seconds to start

    import torch                       # and the engine's other imports

    def start_engine(config):
        with phase("create model"):
            buildops.model_configured(config)  # families that list from the config alone: before allocating
            model = Model(config)
            buildops.model_created(model, config)  # and those that need the model's modules

        def rehearse():
            model(dummy_context_batch)
            model(dummy_decode_step)

        rehearse_then_load(rehearse, lambda: load_checkpoint(model))  # ready: the rest of the sweep goes on
        with phase("capture graphs"):
            buildops.prepare_graph_capture()  # a capture waits for every GPU build
            capture_cuda_graphs(model)

Engines keep their own loaders and runners; these only order and time the steps.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ._config import settings
from ._core import extensions, readiness
from ._core.default import current_builder
from ._core.passes import BuildPass, rehearsal
from ._core.watchdog import stuck_gpu_builds
from ._runtime.forkserver import add_to_preload

__all__ = ["phase", "phases", "ready_time", "rehearse_then_load", "start_build_workers"]

logger = logging.getLogger("buildops")
T = TypeVar("T")

_phases: list[tuple[str, float]] = []
_lock = threading.Lock()


def start_build_workers() -> bool:
    """Start the worker processes that builds compile in, where builds will use them, for each backend whose
    library is installed (Triton's: ``BUILDOPS_EXECUTOR=processes``, or ``auto`` on 8 CPUs or more). Returns at
    once.

    Workers take seconds to be ready (Triton's forkserver imports torch and Triton, then forks them); without this call
    the first build starts them and waits. DeepGEMM's workers fork from that forkserver too, which this call starts
    where DeepGEMM is installed (they start with its builds). This module imports no torch, so an engine can call it
    first thing and the workers' imports run beside its own (docs/decisions/0002-forkserver-preload.md). Each backend
    also prepares what its builds need there (Triton: its CUDA helper module built in a short-lived process; sympy,
    which a replay's first elementwise op on meta tensors needs, imported and Triton's install hashed on a background
    thread once the engine has imported torch and Triton). Nothing here touches a GPU. The workers run below this
    process's CPU priority (``BUILDOPS_WORKER_NICE``).

    No main guard is needed (build workers never import the main module). Call it after setting
    ``TRITON_CACHE_DIR`` if the engine sets it (the helper's process reads it now; if the engine moves the cache
    later, the background thread builds the module there). Calling it again starts workers shut down since.

    Returns:
        Whether some backend's workers, or the forkserver they fork from, run now or are starting: False where no
        backend is installed or none builds in worker processes.

    Raises:
        ConfigError: a ``BUILDOPS_*`` setting has a bad value (each is read here, whether or not workers start).
    """
    settings.validate()  # every setting: a bad value raises here, at the engine's call, not in a build or serving
    installed = [backend for backend in extensions.backends() if backend.installed()]
    for backend in installed:  # every backend's on the forkserver's list before any of them starts it
        if backend.forkserver_preload is not None:
            add_to_preload(extensions.load(backend.forkserver_preload))
    started = False
    for backend in installed:
        if backend.start_workers is not None:
            started = bool(extensions.load(backend.start_workers)()) or started
    return started


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time a startup step: ``with phase("load"): ...`` logs its duration and keeps it for :func:`phases` (even if
    the step raises).

    Args:
        name: the step's name in logs and in :func:`phases`.
    """
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
    """The phases timed so far, in order, as (name, seconds).

    Args:
        clear: forget them after returning them.
    """
    with _lock:
        recorded = list(_phases)
        if clear:
            _phases.clear()
    return recorded


def rehearse_then_load(rehearse: Callable[[], object], load: Callable[[], T], *, name: str = "startup",
                       overlap: bool = False, freeze_heap: bool = False, ready: str = "called",
                       warm: Callable[[], object] | None = None) -> T:
    """Run the dummy forwards in a :func:`~buildops.rehearsal` (their builds start), load the checkpoint while the
    builds run, wait until serving can begin, optionally serve one warm request, and collect the start's garbage:
    before the wait, where there is no warm request and no heap to freeze.

    Ready (``ready="called"``, the default) waits for the builds of the shapes the rehearsal's calls were made at,
    which the engine will certainly call first (an engine names more by calling them in the rehearsal), and for
    every build that does GPU work (autotuning, DeepGEMM's runs, ``@builds_by_running`` ops), which must not run
    beside serving. The rest of the sweep (compiles whose only GPU step is a module load) goes on building, behind
    any build a serving call waits for; each serving call waits only for its own builds, and
    :func:`buildops.join` waits for them all. A CUDA graph capture waits for every GPU build: call
    :func:`buildops.prepare_graph_capture` first (the capture guard says so otherwise). A Ctrl-C (any exception)
    in the load or while it waits until ready cancels the rehearsal's queued builds that no other pass wants, as a
    pass body that raises does, and propagates.

    Args:
        rehearse: runs the dummy forwards.
        load: loads the checkpoint; what it returns is returned, and what it raises is raised.
        name: the rehearsal's name, which also begins the names of the phases timed.
        overlap: start the load on a thread at once, so that it also overlaps the rehearsal's own host work
            (listing is Python, and shares the GIL with the builds). Only for a rehearsal that reads no weight
            values: every op that reads weights returns its placeholder in the rehearsal, and nothing in between
            looks at them.
        freeze_heap: end the start with the heap frozen (``gc.freeze()``), as vLLM's engine does, so that
            collections while serving walk only what serving makes. The heap is frozen as the call begins too, so
            the final collection walks only what the start made. Nothing frozen is collected until
            ``gc.unfreeze()``, neither garbage left before the call nor what becomes garbage later (a model dropped
            in a reference cycle keeps its GPU memory): a price for the engine to weigh. If the call raises, the
            heap is unfrozen, whatever froze it (docs/decisions/0011-freeze-heap-at-end-of-start.md).
        ready: ``"called"`` (see above), or ``"gpu"``: wait for every GPU build, which on a GPU is the whole
            sweep (docs/decisions/0018-ready-without-the-sweep.md).
        warm: once ready, called once, outside any pass, on the loaded weights: a short real request, whose
            one-time costs then fall in the start and not in the first request (kernels that CUDA loads at their
            first launch: the library ops a rehearsal did not run, such as sampling; the caching allocator's first
            blocks; first calls of Python paths). Its calls should be at shapes the rehearsal called: at any other,
            they wait for that shape's builds, as a serving call does. Timed as the phase ``<name>: warm``; what
            it raises is raised.

    Raises:
        ValueError: ``ready`` is neither ``"called"`` nor ``"gpu"`` (before anything runs).
    """
    if ready not in ("called", "gpu"):
        raise ValueError(f"rehearse_then_load(ready={ready!r}): expected 'called' (the builds of the shapes the "
                         f"rehearsal called and those doing GPU work) or 'gpu' (every GPU build)")
    if freeze_heap:
        gc.freeze()
    rehearsing = rehearsal(name)
    try:
        loaded = _rehearse_and_load(rehearsing, rehearse, load, name, overlap)
        # Beside the builds still running, where nothing will be frozen after: this thread would only wait. A heap
        # to be frozen is collected last, or garbage made meanwhile would stay frozen; that collection is cheap.
        collect_early = warm is None and not freeze_heap
        if collect_early:
            _collect_garbage(name)
        with phase(f"{name}: wait until ready"):
            _wait_for_ready_builds(rehearsing, ready)
        readiness.mark_ready()
        if warm is not None:
            with phase(f"{name}: warm"):
                warm()
        if not collect_early:
            _collect_garbage(name)
    except BaseException as error:
        # The start is off (a Ctrl-C in the load, the wait or the warm request, a load that failed): no one wants
        # what the rehearsal queued. A rehearsal body that raised has cancelled its own already.
        _cancel_rehearsal(rehearsing, error)
        if freeze_heap:
            gc.unfreeze()
        raise
    if freeze_heap:
        gc.freeze()
    return loaded


def _collect_garbage(name: str) -> None:
    """Collect the reference cycles the rehearsal's replays (and the warm request) left, in the start and not in
    the first request. A full collection: garbage that outlived the load's automatic collections is in the oldest
    generation (docs/decisions/0011-freeze-heap-at-end-of-start.md)."""
    with phase(f"{name}: collect garbage"):
        gc.collect()


def ready_time() -> float | None:
    """The ``time.perf_counter()`` at which the last :func:`rehearse_then_load` of this process was ready to serve
    (what reports split tunings by, and after which tunings wait for gaps in serving), or None before one was."""
    return readiness.ready_time()


def _cancel_rehearsal(rehearsing: BuildPass, error: BaseException) -> None:
    """Stop listing the rest of its sweeps; cancel the rehearsal's queued builds that no other pass wants, and log
    it."""
    rehearsing.drop_sweeps()
    builder = current_builder()
    if builder is not None and rehearsing.futures:
        cancelled = builder.cancel(rehearsing.futures, releases=rehearsing.encloses)
        if cancelled:
            logger.info("buildops: the start of rehearsal %r ended with %s; cancelled %d queued build(s)",
                        rehearsing.name, type(error).__name__, cancelled)


def _wait_for_ready_builds(rehearsing: BuildPass, ready: str) -> None:
    if ready == "gpu":
        from .capture import GraphCaptureDuringBuild, prepare_graph_capture  # here: this module imports no torch

        try:
            prepare_graph_capture()
        except GraphCaptureDuringBuild as stuck:  # a build that hangs must not fail a start: its op compiles on
            # first use, and the capture guard still refuses a CUDA graph capture while it runs
            logger.warning("%s", stuck)
        return
    builder = current_builder()
    if builder is not None:
        called = rehearsing.called
        # Tunings (serial builds) of shapes the rehearsal did not call go on after ready, behind serving
        builder.wait(lambda r: r.future in called or (r.build.uses_gpu and not r.build.loads_only
                                                      and not r.build.serial),
                     what="builds serving needs first")
    stuck = stuck_gpu_builds()
    if stuck:  # a build that hangs must not fail a start: its op compiles on first use
        logger.warning("buildops: %d GPU build(s) given up as timed out still run (ops: %s); a CUDA graph capture "
                       "is refused while they do", len(stuck), ", ".join(sorted({build.op for build in stuck})))


def _rehearse_and_load(rehearsing: BuildPass, rehearse: Callable[[], object], load: Callable[[], T], name: str,
                       overlap: bool) -> T:
    if not overlap:
        with phase(f"{name}: rehearsal"), rehearsing:
            rehearse()
        with phase(f"{name}: load"):
            return load()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="buildops-load") as loader:
        with phase(f"{name}: load"):
            loading = loader.submit(load)
            try:
                with phase(f"{name}: rehearsal"), rehearsing:
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
