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
from ._core.default import current_builder
from ._core.passes import BuildPass, rehearsal
from ._core.watchdog import stuck_gpu_builds
from ._runtime import gil
from ._runtime.forking import forget_in_child

__all__ = ["phase", "phases", "ready_time", "rehearse_then_load", "start_build_workers"]

logger = logging.getLogger("buildops")
T = TypeVar("T")

# How long the background preparation waits for the engine to import torch and Triton before it gives up.
PREPARE_WAIT_SECONDS = 600.0
# How often it looks whether they are imported.
PREPARE_POLL_SECONDS = 0.05
# How long a build of Triton's CUDA helper module may take before it is stopped (its driver then builds it).
UTILS_WAIT_SECONDS = 60.0

_phases: list[tuple[str, float]] = []
_lock = threading.Lock()
_prepared = False  # what the helper and the background thread do lasts for the process: Triton's cache, the hash
_prepare_lock = threading.Lock()


def start_build_workers() -> bool:
    """Start the worker processes that Triton builds compile in, where builds will use them
    (``BUILDOPS_EXECUTOR=processes``, or ``auto`` on 8 CPUs or more). Returns at once.

    Workers take seconds to be ready (a forkserver imports torch and Triton, then forks them); without this call
    the first Triton build starts them and waits. This module imports no torch, so an engine can call it first
    thing and the forkserver's imports run beside its own (docs/decisions/0002-forkserver-preload.md). It also
    builds Triton's CUDA helper module in a short-lived process; on a background thread, once the engine has
    imported torch and Triton, it imports torch's dynamo (and its symbolic shapes and sympy), which a replay's first
    op on meta tensors needs, then hashes Triton's install. Nothing here touches a GPU. The workers run below this
    process's CPU priority (``BUILDOPS_WORKER_NICE``).

    No main guard is needed (build workers never import the main module). Call it after setting
    ``TRITON_CACHE_DIR`` if the engine sets it (the helper's process reads it now; if the engine moves the cache
    later, the background thread builds the module there). Calling it again starts workers shut down since; the
    helper and the hash run once per process.

    Returns:
        Whether the workers run now or are starting: False without Triton, or where Triton builds use threads.

    Raises:
        ConfigError: a ``BUILDOPS_*`` setting has a bad value (each is read here, whether or not workers start).
    """
    global _prepared
    settings.validate()  # every setting: a bad value raises here, at the engine's call, not in a build or serving
    if importlib.util.find_spec("triton") is None or triton_executor() != "processes":
        return False
    import sysconfig  # here: its import reads the environment, which importing buildops must not

    from .backends.triton.pool import workers

    # Filled here, on the engine's thread: Python fills it lazily and not atomically, and the background imports
    # below (torch's dynamo) read it while the engine's own imports (Triton's) may read it too
    sysconfig.get_config_vars()
    workers.start()  # nothing if they run: buildops.shutdown() stops them, and then this starts them again
    with _prepare_lock:
        if not _prepared:
            utils = _start_building_triton_utils()
            threading.Thread(target=_prepare_builds, args=(utils,), name="buildops-prepare", daemon=True).start()
            _prepared = True
    return True


@forget_in_child
def _forget_the_preparation() -> None:
    # A forked child has not the parent's preparation thread; its hash and cache are the parent's, but a child
    # that starts workers of its own prepares again (cheaply: both are done) rather than guess.
    global _prepared, _prepare_lock
    _prepared, _prepare_lock = False, threading.Lock()


def _prepare_builds(utils: subprocess.Popen | None) -> None:
    # Each step only once the engine's own import of what it uses is done: two threads importing torch at once can
    # fail (one of them sees a partially initialised module).
    deadline = time.monotonic() + PREPARE_WAIT_SECONDS
    if not (_wait_for_import("torch", deadline) and _wait_for_import("triton", deadline)):
        if utils is not None:
            _stop(utils)
        return
    _import_what_replays_need()  # first: a rehearsal may begin at once, and its first op needs it
    # Hashing Triton's install is Python and holds the GIL while the engine makes its model: the short switch
    # interval keeps the engine's GIL-releasing calls from waiting on it (docs/decisions/0004-gil-switch-interval.md).
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


def _wait_for_import(name: str, deadline: float) -> bool:
    """Wait until the engine has imported ``name``; False if ``deadline`` (``time.monotonic()``) passed first."""
    while not _imported(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(PREPARE_POLL_SECONDS)
    return True


def _import_what_replays_need() -> None:
    """Import what a replay's first torch op on meta tensors imports: most of torch's meta kernels are Python
    references, whose first call imports torch's dynamo, and its symbolic shapes and sympy with it. Seconds of
    Python, paid here beside the engine's own start rather than by the rehearsal's first op."""
    try:
        with gil.holding():
            importlib.import_module("torch._dynamo")
    except Exception:  # the replay imports it itself
        logger.debug("buildops: importing torch's dynamo in the background failed", exc_info=True)


# The helper's process sees this process's import path (the same Triton, the same buildops), whatever
# PYTHONPATH says; it reads it from stdin (a command line has a length limit), and prints the cache it built into.
_UTILS_SCRIPT = """\
import json, sys
sys.path[:] = json.load(sys.stdin)
from buildops.startup import _build_triton_utils
raise SystemExit(_build_triton_utils(report=True))
"""


def _start_building_triton_utils() -> subprocess.Popen | None:
    """Start building Triton's CUDA helper module (``cuda_utils``: C, built by the host compiler on a cold Triton
    cache) into Triton's cache, in a process of its own; None if it could not start. Triton would build it at its
    driver's first use, on the engine's main thread (docs/decisions/0002-forkserver-preload.md).

    The process imports only Triton, so it is done long before the engine has imported torch, which a thread here
    would have to wait for; it never initialises CUDA. It has a session of its own, so that stopping it stops the
    host compiler too, and it is stopped at exit if it still runs."""
    try:
        utils = subprocess.Popen([sys.executable, "-c", _UTILS_SCRIPT], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        logger.debug("buildops: could not start building Triton's CUDA utilities ahead of use", exc_info=True)
        return None
    stdin = utils.stdin
    assert stdin is not None  # stdin=PIPE
    try:
        stdin.write(json.dumps([p for p in sys.path if isinstance(p, str)]).encode())
        stdin.close()
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
    stdout = utils.stdout
    assert stdout is not None  # stdout=PIPE
    out = stdout.read().decode(errors="replace").strip()
    stdout.close()
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
    except Exception:  # noqa: BLE001 - no CUDA here, or another Triton: the driver builds it when first used
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
    builds run, wait until serving can begin, optionally serve one warm request, and collect the start's garbage.

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
        with phase(f"{name}: wait until ready"):
            _wait_for_ready_builds(rehearsing, ready)
        _mark_ready()
        if warm is not None:
            with phase(f"{name}: warm"):
                warm()
        with phase(f"{name}: collect garbage"):
            # The rehearsal's replays (and the warm request) leave objects in reference cycles: collect them now,
            # not in the first request. A full collection: garbage that outlived the load's automatic collections
            # is in the oldest generation (docs/decisions/0011-freeze-heap-at-end-of-start.md).
            gc.collect()
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


_ready_at: float | None = None


def _mark_ready() -> None:
    global _ready_at
    _ready_at = time.perf_counter()


def ready_time() -> float | None:
    """The ``time.perf_counter()`` at which the last :func:`rehearse_then_load` of this process was ready to serve
    (what reports split tunings by), or None before one was."""
    return _ready_at


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
