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
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import functools
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any

from .._config import settings
from .forking import forget_in_child
from .hooks import on_shutdown

__all__ = ["WorkerPool"]

logger = logging.getLogger("buildops")

# How long shutdown() waits for a pool that is starting, where it was given no deadline.
START_WAIT_SECONDS = 60.0


def _refuse_while_importing_main() -> None:
    """Workers import the main module as they start (multiprocessing's spawn and forkserver do): one whose
    top-level code starts workers would start them again in every worker, and run the rest of its start there."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        main = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main module"
        raise RuntimeError(f"buildops: {main} starts build workers as it is imported, and this process is a worker "
                           "importing it; put that code under `if __name__ == \"__main__\":`")


def _context(preload: Sequence[str], first: Sequence[str] = ()) -> BaseContext:
    """The forkserver, with ``first`` added before what it imports when it starts and ``preload`` after, where the
    platform has one."""
    if not preload or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    # The forkserver is Python's, shared with any other user of it in this process: keep what they asked it to
    # preload ("__main__" by default). Once it runs, a new list changes nothing; our workers then import for
    # themselves, as spawned ones do.
    server = forkserver._forkserver
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    ours = [m for m in first if m not in current]
    context.set_forkserver_preload(ours + current + [m for m in preload if m not in current and m not in ours])
    return context


def _start_worker(nice: int, initializer: Callable | None) -> None:
    """A worker's first step: lower its CPU priority by ``nice`` (the compilers it runs inherit it), then run the
    pool's initializer. Where the cores are all busy, the engine's own threads then run first
    (docs/decisions/0003-workers-below-engine-priority.md)."""
    if nice:
        try:
            os.nice(nice)
        except OSError:  # not permitted here: the worker builds at the engine's priority
            pass
    if initializer is not None:
        initializer()


class WorkerPool:
    """A lazily started pool of worker processes.

    Args:
        name: what logs call the workers.
        workers: how many, asked when the pool starts.
        initializer: run in each worker as it starts, once the worker has lowered its CPU priority
            (``BUILDOPS_WORKER_NICE``).
        warm_up: a task submitted once per worker when the pool starts, so that all of them start at once and
            :meth:`warm` can tell when they have (each runs ``initializer`` before its first task).
        preload: modules the forkserver imports once, before it forks any worker (see the module docstring),
            after the main module. Their import must not raise anything but ImportError, which the forkserver
            ignores.
        preload_first: modules it imports before ``preload`` (with ``preload`` only): work begun there on a
            thread overlaps ``preload``'s imports. Any thread they start must end during those imports: the
            forkserver forks workers once they are done. The main module, where the forkserver imports it, comes
            between the two (Python 3.11 and 3.12 do not import it there; newer ones, before both).
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

    @property
    def started(self) -> bool:
        return self._pool is not None or self._launcher is not None

    def get(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool, started (not necessarily warm yet) if it was not. May block while the workers start."""
        _refuse_while_importing_main()
        with self._lock:
            if self._pool is None:
                if not self._hooked:
                    forget_in_child(self._forget)
                    on_shutdown.add(self.shutdown)
                    # At exit, before concurrent.futures' own hook (they run in reverse order), which waits for
                    # every worker to finish its task: one stuck in a build would hold the exit for good.
                    register_at_exit = getattr(threading, "_register_atexit", None)
                    if register_at_exit is not None:
                        register_at_exit(self._at_exit)
                    self._hooked = True
                workers = self._workers()
                pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=workers, mp_context=_context(self._preload, self._preload_first),
                    initializer=self._worker_start())
                if self._warm_up is not None:
                    self._starting = [pool.submit(self._warm_up) for _ in range(workers)]
                self._pool = pool  # only now: warm() must not see a pool without its warm-up futures
            return self._pool

    def _worker_start(self) -> Callable[[], None]:
        # The setting is read here, in this process, as the pool starts: a bad value raises where the pool is asked
        # for, not in every worker (which would break the pool), and the workers follow this process's environment,
        # not the one a forkserver started earlier inherited.
        return functools.partial(_start_worker, settings.worker_nice, self._initializer)

    def start(self) -> None:
        """Start the workers on a thread of their own and return at once."""
        _refuse_while_importing_main()
        with self._launch_lock:
            if self._pool is not None or self._launcher is not None:
                return
            self._launcher = threading.Thread(target=self._launch, name=f"buildops-{self.name}-start", daemon=True)
            self._launcher.start()

    def _launch(self) -> None:
        try:
            self.get()
        except Exception:  # e.g. at interpreter exit; a later get() tries again and raises where it is called
            logger.debug("buildops: starting %s workers failed", self.name, exc_info=True)
        finally:
            with self._launch_lock:
                self._launcher = None

    def warm(self) -> bool:
        """True once the workers have started and every one warmed up without error."""
        return self._pool is not None and all(f.done() and f.exception() is None for f in self._starting)

    def run(self, what: str, fn: Callable, *args: Any, given_up: threading.Event | None = None) -> Any:
        """``fn(*args)`` in a worker. When a worker crashes, every call in flight on the pool fails with it, so
        each is retried once, alone in a worker of its own: only the call that crashed it crashes again, and
        then it raises. A call whose ``given_up`` is set by then (see :meth:`stop_workers`) raises instead."""
        pool = self.get()
        self._refuse_if_given_up(what, given_up)
        try:
            return pool.submit(fn, *args).result()
        except concurrent.futures.process.BrokenProcessPool:
            self._replace(pool)
        self._refuse_if_given_up(what, given_up)
        logger.warning("buildops: a %s worker crashed while it built %s (or another build beside it); retrying it "
                       "once in a worker of its own", self.name, what)
        alone = concurrent.futures.ProcessPoolExecutor(1, mp_context=_context(self._preload, self._preload_first),
                                                       initializer=self._worker_start())
        with self._lock:
            self._alone.add(alone)  # stop_workers() stops it too
        try:
            return alone.submit(fn, *args).result()
        except concurrent.futures.process.BrokenProcessPool:
            self._refuse_if_given_up(what, given_up)
            raise RuntimeError(f"buildops: {self.name} worker crashed twice building {what}") from None
        finally:
            with self._lock:
                self._alone.discard(alone)
            alone.shutdown(wait=False, cancel_futures=True)

    def _refuse_if_given_up(self, what: str, given_up: threading.Event | None) -> None:
        if given_up is not None and given_up.is_set():
            raise RuntimeError(f"buildops: {what} was given up, and its {self.name} worker stopped")
        if self._exiting:  # no retry in a worker of its own: the exit would wait for it
            raise RuntimeError(f"buildops: {what} was stopped: the interpreter is exiting")

    def _at_exit(self) -> None:
        self._exiting = True
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
            try:
                process.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._stopping = [p for p in self._stopping if _alive(p)]

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
        # get() holds the lock while a pool starts, for good where the forkserver's preload hangs (a stuck ptxas
        # in its warm-up compile): wait for it within the deadline, or a bounded time, then go on without it.
        limit = START_WAIT_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
        locked = self._lock.acquire(timeout=limit)
        try:
            pool, self._pool, self._starting = self._pool, None, []
        finally:
            if locked:
                self._lock.release()
        if not locked:
            logger.warning("buildops: %s workers still starting after %.0f s; shutting down without them",
                           self.name, limit)
        if pool is not None:
            if not (wait and deadline is None):  # not waited for: stop_workers() may still have to stop them
                self._stopping += [p for p in (getattr(pool, "_processes", None) or {}).values() if _alive(p)]
            pool.shutdown(wait=wait and deadline is None, cancel_futures=True)

    def _forget(self) -> None:
        self._lock, self._launch_lock, self._launcher = threading.Lock(), threading.Lock(), None
        self._pool, self._starting, self._alone, self._stopping = None, [], set(), []
        if self._preload:
            _forget_the_forkserver()


def _alive(process: Any) -> bool:
    try:
        return process.is_alive()
    except Exception:  # noqa: BLE001 - not a child of this process any more, or closed
        return False


def _forget_the_forkserver() -> None:
    """In a forked child: Python's forkserver object still names the parent's server, and starting a pool through
    it would wait for a process that is not this one's child (``ChildProcessError`` on every build). Forgotten, it
    starts a server of this process's own. Closing the inherited end of the pipe that keeps the parent's server
    alive also lets that server exit with the parent."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # its private state, which typeshed leaves out
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"):
        if hasattr(server, name):
            setattr(server, name, None)
    if hasattr(server, "_lock"):
        server._lock = threading.Lock()
