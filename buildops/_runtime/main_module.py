"""The program's main module kept out of build workers.

multiprocessing has every child it starts import the parent's main module: a script whose build pass runs at module
level, with no ``if __name__ == "__main__":`` guard, would run its pass again in every worker. The preparation data
that multiprocessing sends a worker of ours names no main module (a :class:`~buildops._runtime.patching.Patch` of
``multiprocessing.spawn.get_preparation_data``, effective only on the thread that starts the worker), and the
forkserver is never asked to preload it. Tasks and their arguments therefore must not name anything defined in the
main module (:func:`names_of_main` finds them). Where a worker imports the main module all the same (forked from a
forkserver that another library started with it preloaded, which Python 3.14 honours) and the module starts builds,
the worker exits at once with :data:`MAIN_MODULE_EXIT`, and the parent fails the build with the fix.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.context as mp_context
import multiprocessing.spawn
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.reduction import ForkingPickler
from typing import Any

from .forkserver import add_to_preload
from .patching import Patch
from .state import runtime

__all__ = ["MAIN_MODULE_EXIT", "context", "ended_importing_main", "names_of_main", "refuse_while_importing_main",
           "start_forkserver"]

# How long a broken pool's own thread is given to reap its workers before their exit statuses are read.
REAP_WAIT_SECONDS = 5.0
# The exit status of a worker that found itself importing a main module that starts builds (no Python error or
# signal ends a process with it).
MAIN_MODULE_EXIT = 86

# What names buildops' workers, as multiprocessing.current_process().name, from before they import anything.
_WORKER_NAME = "buildops-worker"
# The keys of multiprocessing's preparation data that make a child import the main module (main_path: the
# forkserver's own, on versions that pass it).
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path", "main_path")
_MAIN_NAMES = ("__main__", "__mp_main__")  # what the main module is called in this process, and in a child


def _worker_name(default: str) -> str:
    """``buildops-worker-3`` for multiprocessing's ``SpawnProcess-3``: the child knows it is ours by its name, which
    it gets before it would import the main module."""
    return f"{_WORKER_NAME}-{default.rsplit('-', 1)[-1]}"


def _without_main(original: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(runtime.starting_workers, "workers", False):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data
    return get_preparation_data


_PREPARATION = Patch(multiprocessing.spawn, "get_preparation_data", _without_main,
                     "multiprocessing (CPython 3.10 on) tells every child it spawns or forks from its forkserver to "
                     "import the parent's main module (init_main_from_path/init_main_from_name), and 3.14 passes it "
                     "to a forkserver that preloads __main__: a script with no main guard would run again in every "
                     "build worker")


@contextlib.contextmanager
def _keeping_main_out() -> Iterator[None]:
    """While this thread starts one of buildops' workers, and maybe the forkserver it is forked from, the preparation
    data multiprocessing sends them names no main module. Other threads, other users of multiprocessing, are
    unaffected."""
    _PREPARATION.acquire()
    before = getattr(runtime.starting_workers, "workers", False)
    runtime.starting_workers.workers = True
    try:
        yield
    finally:
        runtime.starting_workers.workers = before
        _PREPARATION.release()


def _worker_process(base: Any, name: str) -> Any:
    """``base`` (a context's Process class) for a :class:`WorkerPool`'s workers: started with no main module in
    their preparation data, and named as buildops'. Kept in this module under ``name``: a worker's process object
    is pickled to it, class and all."""

    class Worker(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.name = _worker_name(self.name)

        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            with _keeping_main_out():
                return base._Popen(process_obj)

    Worker.__qualname__ = Worker.__name__ = name
    return Worker


_SpawnedWorker = _worker_process(mp_context.SpawnProcess, "_SpawnedWorker")


class _SpawnContext(mp_context.SpawnContext):
    Process = _SpawnedWorker


if sys.platform != "win32":  # the forkserver is POSIX's
    _ForkedWorker = _worker_process(mp_context.ForkServerProcess, "_ForkedWorker")

    class _ForkServerContext(mp_context.ForkServerContext):
        Process = _ForkedWorker


def refuse_while_importing_main() -> None:
    """Children that multiprocessing starts import the main module as they start, except buildops' own workers:
    one whose top-level code starts workers would start them again in every child, and run the rest of its start
    there. One of our workers that imports it all the same (see the module docstring) exits at once, so that its
    parent sees its pool break and says what to change (``WorkerPool._raise_if_main_ran``)."""
    process = multiprocessing.current_process()
    if not getattr(process, "_inheriting", False):
        return
    main = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main module"
    if process.name.startswith(_WORKER_NAME):
        try:
            sys.stderr.write(f"buildops: build worker {process.name} is importing {main}, which starts builds as it "
                             "is imported; the worker exits\n")
            sys.stderr.flush()
        finally:
            os._exit(MAIN_MODULE_EXIT)
    raise RuntimeError(f"buildops: {main} starts build workers as it is imported, and this process is a child "
                       "importing it; put that code under `if __name__ == \"__main__\":`")


def context(preload: Sequence[str], first: Sequence[str] = ()) -> BaseContext:
    """The forkserver, with ``first`` added before what it imports when it starts and ``preload`` after
    (:func:`.forkserver.add_to_preload`), where the platform has one; else spawn. Either starts workers that import
    no main module."""
    if not preload or not add_to_preload(preload, first):
        return _SpawnContext()
    return _ForkServerContext()


def start_forkserver(preload: Sequence[str]) -> bool:
    """Start the forkserver now, with ``preload`` added to what it imports, so that workers forked later find those
    imports done; returns at once, while the forkserver imports on its own. False where workers are spawned instead.
    A forkserver that already runs is kept as it is."""
    refuse_while_importing_main()
    if not add_to_preload(preload):
        return False
    from multiprocessing import forkserver

    with _keeping_main_out():
        forkserver.ensure_running()
    return True


class _MainFinder(ForkingPickler):
    """Pickles as a pool does, noting what it names in the main module."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())
        self.found: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        try:
            if getattr(obj, "__module__", None) in _MAIN_NAMES:
                self.found.append(getattr(obj, "__qualname__", None) or type(obj).__qualname__)
        except Exception:  # noqa: BLE001 - an object whose attributes raise: pickling decides
            pass
        return NotImplemented


def names_of_main(what: Any) -> list[str]:
    """What ``what`` names in the main module when pickled for a worker (which does not import it), as far as it
    pickles (where it does not, the pool raises that itself)."""
    finder = _MainFinder()
    try:
        finder.dump(what)
    except Exception:  # noqa: BLE001 - see the docstring
        pass
    return sorted(set(finder.found))


def ended_importing_main(processes: Sequence[Any]) -> bool:
    """Whether one of a broken pool's workers exited as it imported a main module that starts builds. The statuses
    are read as the pool's own thread caches them when it reaps the workers of a broken pool, never polled here: two
    threads polling a forkserver child race for its one status message."""
    started = [p for p in processes if getattr(p, "_popen", None) is not None]
    deadline = time.monotonic() + REAP_WAIT_SECONDS
    while True:
        statuses = [getattr(p._popen, "returncode", None) for p in started]
        if MAIN_MODULE_EXIT in statuses:
            return True
        if None not in statuses or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
