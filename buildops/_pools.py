"""Spawned worker processes for builds that must not run in this process's threads.

Both Triton (its front end holds the GIL) and DeepGEMM (its binding holds the GIL while it compiles) build in
worker processes. A :class:`SpawnPool` starts its workers on first use, keeps them for later builds, stops them at
``buildops.shutdown()``, and is forgotten by a forked child (the parent's workers are not the child's). Workers are
spawned, not forked: the parent has threads, and maybe a CUDA context, that a fork would corrupt.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from typing import Any

from ._builder import add_shutdown_hook

__all__ = ["SpawnPool"]

logger = logging.getLogger("buildops")


class SpawnPool:
    """A lazily started pool of spawned processes.

    Args:
        name: what logs call the workers.
        workers: how many, asked when the pool starts.
        initializer, initargs: run in each worker as it starts; ``initargs`` is asked when the pool starts.
        warm_up: a task submitted once per worker when the pool starts, so that all of them start at once and
            :meth:`warm` can tell when they have (each runs ``initializer`` before its first task).
    """

    def __init__(self, name: str, workers: Callable[[], int], initializer: Callable | None = None,
                 initargs: Callable[[], tuple] = tuple, warm_up: Callable[[], Any] | None = None) -> None:
        self.name, self._workers, self._initializer, self._initargs = name, workers, initializer, initargs
        self._warm_up = warm_up
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._starting: list[concurrent.futures.Future] = []
        self._hooked = False

    @property
    def started(self) -> bool:
        return self._pool is not None

    def get(self) -> concurrent.futures.ProcessPoolExecutor:
        """The pool, started (not necessarily warm yet) if it was not."""
        with self._lock:
            if self._pool is None:
                if not self._hooked:
                    os.register_at_fork(after_in_child=self._forget)
                    add_shutdown_hook(self.shutdown)
                    self._hooked = True
                workers = self._workers()
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=self._initializer, initargs=self._initargs())
                if self._warm_up is not None:
                    self._starting = [self._pool.submit(self._warm_up) for _ in range(workers)]
            return self._pool

    def warm(self) -> bool:
        """True once every worker has started and warmed up; starts them if nobody did yet."""
        self.get()
        return all(f.done() for f in self._starting)

    def run(self, what: str, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` in a worker. A crashed worker is replaced and the call retried once, then it raises."""
        for attempt in (1, 2):
            pool = self.get()
            try:
                return pool.submit(fn, *args).result()
            except concurrent.futures.process.BrokenProcessPool:
                self._replace(pool)
                if attempt == 2:
                    raise RuntimeError(f"buildops: {self.name} worker crashed twice building {what}") from None
                logger.warning("buildops: a %s worker crashed building %s; retrying once in a new one", self.name,
                               what)

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool, self._starting = None, []
        broken.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool, self._starting = self._pool, None, []
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._pool, self._starting = None, []
