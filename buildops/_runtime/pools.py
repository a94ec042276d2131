"""Worker processes for builds that must not run in this process's threads.

Both Triton (its front end holds the GIL) and DeepGEMM (its binding holds the GIL while it compiles) build in
worker processes (docs/decisions/0001-worker-processes-for-triton.md,
docs/decisions/0013-deep-gemm-in-worker-processes.md). A :class:`WorkerPool` starts its workers on first use, keeps
them for later builds, stops them at ``buildops.shutdown()``, and is forgotten by a forked child (the parent's
workers are not the child's).

Workers are never forked from this process: it has threads, and maybe a CUDA context, that a fork would corrupt.
They are spawned, or, for a pool with ``preload`` modules, forked from Python's forkserver (a clean process that
imported those modules once), so that each worker does not import torch itself
(docs/decisions/0002-forkserver-preload.md).

Workers never import the program's main module (:mod:`.main_module`).

Each worker leads a process group of its own, and is stopped by killing it, compilers and all
(:mod:`.worker_groups`). A group of its own does not get the terminal's Ctrl-C: the workers are killed when this
process exits (:meth:`WorkerPool.stop_workers` at exit) or shuts them down; a worker whose parent process is gone
without that (killed outright) kills its own group.

Calls take turns at the workers (:mod:`.turns`): a pool admits as many calls at once as it has workers, so none
waits in the executor's own first-in, first-out queue, and a build that a serving call waits for goes first.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._config import settings
from .crashes import CrashWatch, end_status, how_it_ended
from .forking import forget_in_child
from .forkserver import add_to_preload
from .hooks import on_shutdown
from .main_module import context, ended_importing_main, names_of_main, refuse_while_importing_main
from .turns import Turns
from .worker_groups import alive, kill_group, kill_pgid, own_group, start_worker

__all__ = ["WorkerPool"]

logger = logging.getLogger("buildops")

# How long shutdown() (where it was given no deadline) and the interpreter's exit wait for a pool that is starting.
START_WAIT_SECONDS = 60.0


def _worker_processes(pool: concurrent.futures.ProcessPoolExecutor) -> dict[int, Any]:
    """The pool's own map of its worker processes, which it fills as it starts them: kept by the caller, it outlives
    the pool's shutdown(), which drops the pool's reference to it."""
    processes = getattr(pool, "_processes", None)
    return processes if isinstance(processes, dict) else {}


class WorkerPool:
    """A lazily started pool of worker processes.

    Args:
        name: what logs call the workers.
        workers: how many, asked when the pool starts.
        initializer: run in each worker as it starts, once the worker has lowered its CPU priority
            (``BUILDOPS_WORKER_NICE``).
        warm_up: a task submitted once per worker when the pool starts, so that all of them start at once and
            :meth:`warm` can tell when they have (each runs ``initializer`` before its first task).
        preload: modules the forkserver imports once, before it forks any worker (see the module docstring).
            Their import must not raise anything but ImportError, which the forkserver ignores.
        preload_first: modules it imports before ``preload`` (with ``preload`` only): work begun there on a
            thread overlaps ``preload``'s imports. Any thread they start must end during those imports: the
            forkserver forks workers once they are done. Modules others asked the forkserver to preload come
            between the two; the main module never does.
    """

    def __init__(self, name: str, workers: Callable[[], int], initializer: Callable | None = None,
                 warm_up: Callable[[], Any] | None = None, preload: Sequence[str] = (),
                 preload_first: Sequence[str] = ()) -> None:
        self.name, self._workers, self._initializer = name, workers, initializer
        self._warm_up, self._preload, self._preload_first = warm_up, tuple(preload), tuple(preload_first)
        self._lock = threading.Lock()  # held while the pool starts, which can take seconds (a forkserver's imports)
        self._launch_lock = threading.Lock()
        self._launcher: threading.Thread | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._alone: set[concurrent.futures.ProcessPoolExecutor] = set()  # one-worker pools retrying a crashed call
        self._stopping: list[Any] = []  # workers of pools shut down without waiting, maybe still in a build
        self._exiting = False  # the interpreter is exiting: calls that lose their worker are not retried
        self._starting: list[concurrent.futures.Future] = []
        self._hooked = False
        self._main_ran: str | None = None  # why every call fails at once: a worker imported the main module
        self._turns = Turns()  # one call per worker at a time, urgent builds first
        self._limit: int | None = None  # fewer calls at once than workers, where limit() said so
        self._size = 0  # the workers of the pool now started
        self._crashes = CrashWatch(name)  # refuses calls once the workers crash whatever they run

    @property
    def started(self) -> bool:
        return self._pool is not None or self._launcher is not None

    def get(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool, started (not necessarily warm yet) if it was not. May block while the workers start.

        Raises:
            RuntimeError: a worker imported a main module that starts builds, or the interpreter is exiting.
        """
        refuse_while_importing_main()
        if self._main_ran is not None:
            raise RuntimeError(self._main_ran)
        with self._lock:
            return self._pool if self._pool is not None else self._start_locked()

    def _start_locked(self) -> concurrent.futures.ProcessPoolExecutor:
        """Start the pool, under the lock, which is held until every worker is forked."""
        if self._exiting:  # see _at_exit: no one would stop this pool
            raise RuntimeError(f"buildops: {self.name} workers not started: the interpreter is exiting")
        self._hook()
        workers = self._workers()
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=context(self._preload, self._preload_first),
            initializer=self._worker_start())
        self._size = workers
        self._turns.set_limit(min(workers, self._limit or workers))
        if self._warm_up is not None:
            self._starting = [pool.submit(self._warm_up) for _ in range(workers)]
            if self._starting:  # a start that fails for want of the main guard is said now, not later
                self._starting[0].add_done_callback(functools.partial(self._warmed, _worker_processes(pool)))
        self._pool = pool  # only now: warm() must not see a pool without its warm-up futures
        return pool

    def _hook(self) -> None:
        """Have the pool stopped at ``buildops.shutdown()`` and at exit, and forgotten in a forked child: before
        it starts, whether on this thread or on start()'s."""
        with self._launch_lock:
            if self._hooked:
                return
            forget_in_child(self._forget)
            on_shutdown.add(self.shutdown)
            # At exit, before concurrent.futures' own hook (they run in reverse order), which waits for every
            # worker to finish its task: one stuck in a build would hold the exit for good.
            register_at_exit = getattr(threading, "_register_atexit", None)
            if register_at_exit is not None:
                register_at_exit(self._at_exit)
            self._hooked = True

    def _worker_start(self) -> Callable[[], None]:
        # Read here, in this process, as the pool starts: a bad setting raises where the pool is asked for, not in
        # every worker (which would break the pool); and the workers take this process's environment as it is now,
        # which a forked one would not have (the forkserver's is the one it started with).
        return functools.partial(start_worker, settings.worker_nice, self._initializer, os.getpid(), dict(os.environ))

    def start(self) -> None:
        """Start the workers on a thread of their own and return at once."""
        refuse_while_importing_main()
        self._hook()  # a shutdown() before the pool starts must reach it, to call the start off
        # What the forkserver is to import, added now on the caller's thread: another pool's workers started right
        # after this call (startup.start_build_workers) may start the forkserver before this pool's thread does.
        if self._preload:
            add_to_preload(self._preload, self._preload_first)
        with self._launch_lock:
            if self._pool is not None or self._launcher is not None:
                return
            self._launcher = threading.Thread(target=self._launch, name=f"buildops-{self.name}-start", daemon=True)
            self._launcher.start()

    def _launch(self) -> None:
        me = threading.current_thread()
        try:
            if self._main_ran is None:
                with self._lock:
                    # Only while this launch is still wanted: once shutdown() has run (and dropped it), a pool
                    # started here would run with no one to stop it.
                    if self._launcher is me and self._pool is None:
                        self._start_locked()
        except Exception:  # e.g. at interpreter exit; a later get() tries again and raises where it is called
            logger.debug("buildops: starting %s workers failed", self.name, exc_info=True)
        finally:
            with self._launch_lock:
                if self._launcher is me:  # not a launch that start() began after a shutdown()
                    self._launcher = None

    def limit(self, calls: int) -> None:
        """At most ``calls`` calls at once from now on (and at most the pool's workers). A pool that is not warmed
        up starts its workers as calls come (``ProcessPoolExecutor`` spawns one where none is idle), so fewer calls
        at once start fewer workers."""
        self._limit = max(1, calls)
        with self._lock:
            if self._pool is not None:
                self._turns.set_limit(min(self._size, self._limit))

    def warm(self) -> bool:
        """True once the workers have started and every one warmed up without error."""
        return self._pool is not None and all(f.done() and f.exception() is None for f in self._starting)

    def run(self, what: str, fn: Callable, *args: Any, given_up: threading.Event | None = None,
            build: bool = True) -> Any:
        """``fn(*args)`` in a worker, once it has its turn (see the module docstring). When a worker crashes, every
        call in flight on the pool fails with it, so each is retried once, alone in a worker of its own: only the
        call that crashed it crashes again, and then it raises. A call whose ``given_up`` is set by then (see
        :meth:`stop_workers`) raises instead, and so does one that :class:`~.crashes.CrashWatch` refuses. A call that
        is not a build (``build=False``: a probe of the workers themselves) does not tell the watch, as it returns,
        that the pool's builds work.

        Raises:
            ImportError: ``fn`` or ``args`` name something defined in the main module, which workers do not import.
            RuntimeError: the call was given up, crashed twice, was not run after crashes with nothing built, or a
                worker imported a main module that starts builds as it is imported (the message says what to
                change).
        """
        named = names_of_main((fn, args))
        if named:
            raise ImportError(f"buildops: {what} passes {', '.join(named)} of the main module to a "
                              f"{self.name} worker, which does not import the main module; define it in a module "
                              "of its own")
        self._crashes.refuse(what)
        pool = self.get()
        processes = _worker_processes(pool)
        self._refuse_if_given_up(what, given_up)
        with contextlib.ExitStack() as running:
            try:
                with self._turns.turn():
                    self._refuse_if_given_up(what, given_up)  # it may have been given up while it waited
                    self._crashes.refuse(what)
                    running.enter_context(self._crashes.running())  # until the end of its retry, if any
                    return self._returned(pool.submit(fn, *args).result(), build)
            except concurrent.futures.process.BrokenProcessPool:
                self._replace(pool)
            return self._returned(self._retry_alone(what, fn, args, given_up, processes), build)

    def _returned(self, result: Any, build: bool) -> Any:
        return self._crashes.returned(result) if build else result

    def _retry_alone(self, what: str, fn: Callable, args: tuple, given_up: threading.Event | None,
                     processes: dict[int, Any]) -> Any:
        """The retry of a call whose worker crashed, in a worker of its own (see :meth:`run`)."""
        self._raise_if_main_ran(list(processes.values()))
        self._refuse_if_given_up(what, given_up)
        logger.warning("buildops: a %s worker crashed while it built %s (or another build beside it); retrying it "
                       "once in a worker of its own", self.name, what)
        alone = concurrent.futures.ProcessPoolExecutor(1, mp_context=context(self._preload, self._preload_first),
                                                       initializer=self._worker_start())
        processes = _worker_processes(alone)
        with self._lock:
            self._alone.add(alone)  # stop_workers() stops it too
        try:
            return alone.submit(fn, *args).result()
        except concurrent.futures.process.BrokenProcessPool:
            self._raise_if_main_ran(list(processes.values()))
            self._refuse_if_given_up(what, given_up)
            code = end_status(list(processes.values()))
            self._crashes.crashed(what, code)
            message = f"buildops: {self.name} worker crashed twice building {what}{how_it_ended(code)}"
            raise RuntimeError(message) from None
        finally:
            with self._lock:
                self._alone.discard(alone)
            alone.shutdown(wait=False, cancel_futures=True)

    def _warmed(self, processes: dict[int, Any], warming: concurrent.futures.Future) -> None:
        # On the pool's own thread, which reaps the workers of a broken pool only after this returns.
        if warming.cancelled() or not isinstance(warming.exception(), concurrent.futures.process.BrokenProcessPool):
            return
        with contextlib.suppress(Exception):  # e.g. no new thread at interpreter exit: the first call says it
            threading.Thread(target=self._note_if_main_ran, args=(processes,), name=f"buildops-{self.name}-check",
                             daemon=True).start()

    def _note_if_main_ran(self, processes: dict[int, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # logged by _raise_if_main_ran
            self._raise_if_main_ran(list(processes.values()))

    def _raise_if_main_ran(self, processes: Sequence[Any]) -> None:
        """Raise, and fail every later call at once, where a worker of this broken pool exited as it imported a main
        module that starts builds (see the module docstring): each new worker would do the same."""
        if self._main_ran is None and not ended_importing_main(processes):
            return
        main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main module"
        message = (f"buildops: {self.name} workers imported {main} as they started, and it starts builds as it is "
                   "imported; put that code under `if __name__ == \"__main__\":` (buildops keeps the main module "
                   "out of its workers, but not out of a forkserver that another library started with it "
                   "preloaded)")
        with self._lock:
            first = self._main_ran is None
            if first:
                self._main_ran = message
        if first:
            logger.error("%s", message)
        raise RuntimeError(self._main_ran or message)

    def _refuse_if_given_up(self, what: str, given_up: threading.Event | None) -> None:
        if given_up is not None and given_up.is_set():
            raise RuntimeError(f"buildops: {what} was given up, and its {self.name} worker stopped")
        if self._exiting:  # no retry in a worker of its own: the exit would wait for it
            raise RuntimeError(f"buildops: {what} was stopped: the interpreter is exiting")

    def _at_exit(self) -> None:
        """Stop the workers, and those of a pool still starting, before the interpreter's own exit hooks run."""
        self._exiting = True  # no pool starts from now on
        # A pool still starting (get() holds the lock until every worker is forked) is waited for, then stopped: no
        # one else would. concurrent.futures' hook does not know it yet, and multiprocessing's removes its semaphores
        # (a worker forked after that fails as it starts, with a traceback) and its call queue's feeder (a worker
        # already up never gets its stop message), then waits for every worker.
        if self._lock.acquire(timeout=START_WAIT_SECONDS):
            self._lock.release()
        self.stop_workers()

    def stop_workers(self) -> None:
        """Kill every worker now, for a call its caller gave up while a worker is stuck in it (a worker cannot be
        told to drop one task, and a stuck one would hold its place and keep the process from exiting). The
        other calls in flight fail over as after a crash: each is retried alone."""
        # Without the lock, which get() holds while a pool starts (seconds, or for good where a forkserver's
        # preload hangs): a pool being started has no call in a worker yet.
        processes = list(self._stopping)
        for pool in [self._pool, *list(self._alone)]:
            processes += list((getattr(pool, "_processes", None) or {}).values())
        for process in processes:
            kill_group(process)
        self._stopping = [p for p in self._stopping if alive(p)]

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool, self._starting = None, []
        broken.shutdown(wait=False, cancel_futures=True)

    def shutdown(self, wait: bool = True, deadline: float | None = None) -> None:
        """Stop the workers; with ``wait``, once their running tasks are done. With a ``deadline`` (``buildops.
        shutdown(timeout=...)``) they are told to stop and not waited for: a worker cannot be waited for a bounded
        time, and one stuck in a build must not hold up the caller; it exits once that build ends, or is killed
        when the build is given up (:meth:`stop_workers`) or at exit."""
        with self._launch_lock:
            self._launcher = None  # a start() whose thread has not begun starting the pool does not (see _launch)
        # get() holds the lock while a pool starts, for good where the forkserver's preload hangs (a stuck ptxas
        # in its warm-up compile): wait for it within the deadline, or a bounded time, then go on without it.
        limit = START_WAIT_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
        locked = self._lock.acquire(timeout=limit)
        try:
            pool, self._pool, self._starting, self._main_ran = self._pool, None, [], None
            self._crashes = CrashWatch(self.name)  # a pool started after this one tries its calls again
        finally:
            if locked:
                self._lock.release()
        if not locked:
            logger.warning("buildops: %s workers still starting after %.0f s; shutting down without them",
                           self.name, limit)
        if pool is not None:
            processes = [p for p in (getattr(pool, "_processes", None) or {}).values() if alive(p)]
            if not (wait and deadline is None):  # not waited for: stop_workers() may still have to stop them
                self._stopping += processes
            groups = [pid for pid in map(own_group, processes) if pid is not None]
            pool.shutdown(wait=wait and deadline is None, cancel_futures=True)
            if wait and deadline is None:  # the workers exited: what they started, and left running, goes too
                for group in groups:
                    kill_pgid(group)

    def _forget(self) -> None:
        self._lock, self._launch_lock, self._launcher = threading.Lock(), threading.Lock(), None
        self._pool, self._starting, self._alone, self._stopping = None, [], set(), []
        self._main_ran, self._turns, self._limit = None, Turns(), None
        self._crashes = CrashWatch(self.name)

