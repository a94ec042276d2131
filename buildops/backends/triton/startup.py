"""Triton's part of an engine's start (:func:`buildops.startup.start_build_workers`): its worker processes
started early, its CUDA helper module built in a process of its own, and its install hashed in the background.

Imports neither torch nor Triton: the engine calls it first thing, before its own imports.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from ..._config import triton_executor
from ..._runtime import gil
from .state import triton_state

__all__ = ["start_workers"]

logger = logging.getLogger("buildops")

# How long the background preparation waits for the engine to import torch and Triton before it gives up.
PREPARE_WAIT_SECONDS = 600.0
# How often it looks whether they are imported.
PREPARE_POLL_SECONDS = 0.05
# How long a build of Triton's CUDA helper module may take before it is stopped (its driver then builds it).
UTILS_WAIT_SECONDS = 60.0


def start_workers() -> bool:
    """Start the worker processes Triton builds compile in, where builds will use them (``BUILDOPS_EXECUTOR=
    processes``, or ``auto`` on 8 CPUs or more), and prepare what builds and replays need; returns at once
    (the ``Backend`` contract's ``start_workers``).

    Workers take seconds to be ready (a forkserver imports torch and Triton, then forks them): started here, its imports
    run beside the engine's own (docs/decisions/0002-forkserver-preload.md). It also builds Triton's CUDA helper module
    in a short-lived process; on a background thread, once the engine has imported torch and Triton, it imports sympy,
    which a replay's first elementwise op on meta tensors needs, then hashes Triton's install. Nothing here touches a
    GPU or imports torch. The helper and the hash run once per process; calling it again starts workers shut down since.
    """
    if triton_executor() != "processes":
        return False
    import sysconfig  # here: its import reads the environment, which importing buildops must not

    from .worker import workers

    # Filled here, on the engine's thread: Python fills it lazily and not atomically, and the background imports
    # below (sympy's) read it while the engine's own imports (Triton's) may read it too
    sysconfig.get_config_vars()
    workers.start()  # nothing if they run: buildops.shutdown() stops them, and then this starts them again
    with triton_state.prepare_lock:
        if not triton_state.prepared:
            utils = _start_building_triton_utils()
            threading.Thread(target=_prepare_builds, args=(utils,), name="buildops-prepare", daemon=True).start()
            triton_state.prepared = True
    return True


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
            from .build import hash_triton_install

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
    """Prepare what a replay's first elementwise op on meta tensors needs: sympy, which torch's type promotion
    imports at its first use (a tenth of a second or more of Python), and the stand-ins that let torch's meta kernels
    run without importing dynamo (``_core/meta_refs.py``); paid here beside the engine's own start rather than by
    the rehearsal's first op."""
    try:
        from ..._core.meta_refs import find_stand_ins

        with gil.holding():
            importlib.import_module("sympy")
            find_stand_ins()
    except Exception:  # the replay does it itself
        logger.debug("buildops: preparing what replays need in the background failed", exc_info=True)


# The helper's process sees this process's import path (the same Triton, the same buildops), whatever
# PYTHONPATH says; it reads it from stdin (a command line has a length limit), and prints the cache it built into.
_UTILS_SCRIPT = """\
import json, sys
sys.path[:] = json.load(sys.stdin)
from buildops.backends.triton.startup import _build_triton_utils
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
    try:
        out = stdout.read().decode(errors="replace").strip()
        stdout.close()
    except (OSError, ValueError):  # closed by _stop at the interpreter's exit, while this thread read it
        return None
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

        from .versions import build_cuda_utils

        build_cuda_utils()
    except Exception:  # noqa: BLE001 - no CUDA here, or another Triton: the driver builds it when first used
        return 1
    if report:
        print(knobs.cache.dir, flush=True)
    return 0


def _imported(name: str) -> bool:
    """Whether module ``name`` is imported and done initialising (importlib marks it while it runs)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)
