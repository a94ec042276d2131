"""The builder's threads: up to ``limit`` workers on its queue and one on its serial queue.

A thread starts when a build is queued and its queue has fewer threads than it may; one stuck in a build given up
as timed out is replaced (it ends once its run returns, if ever); at shutdown each is stopped by the queue and
joined here. The builder calls the ``*_locked`` methods under its lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .watchdog import stuck

__all__ = ["BuilderThreads", "join_threads", "on_builder_thread"]

logger = logging.getLogger("buildops")

# How long a join waits on one thread at a time before it looks again at which are stuck.
JOIN_STEP_SECONDS = 0.1

_role = threading.local()  # .builder: this thread is one of a builder's


def on_builder_thread() -> bool:
    """True on a builder's worker thread (compiles there are builds, not late compiles)."""
    return getattr(_role, "builder", False)


class BuilderThreads:
    """A builder's worker threads. ``work(serial)`` is a thread's loop: it returns when the thread is to end.

    Args:
        limit: the most threads on the normal queue (``BUILDOPS_THREADS``).
        work: the loop of a thread on the serial queue (``work(True)``) or the normal one (``work(False)``).
    """

    def __init__(self, limit: int, work: Callable[[bool], None]) -> None:
        self.limit = limit
        self._work = work
        self._normal: list[threading.Thread] = []
        self._serial: threading.Thread | None = None
        self._started = 0  # for names: a thread in place of a stuck one gets a new name

    def start_for_locked(self, serial: bool) -> None:
        """A thread for a build about to be queued, if its queue has fewer than it may."""
        if serial:
            if self._serial is None:
                self._serial = self._start("buildops-serial", serial=True)
        elif len(self._normal) < self.limit:
            self._normal.append(self._start(f"buildops-worker-{self._started}", serial=False))
            self._started += 1

    def replace_locked(self, thread: threading.Thread | None, serial: bool, needed: bool) -> None:
        """Forget ``thread``, stuck in a build given up, and start one in its place where ``needed`` (builds are
        queued for it, or may be)."""
        if serial:
            if self._serial is thread:
                self._serial = None
                if needed:
                    self.start_for_locked(serial=True)
        elif thread in self._normal:
            self._normal.remove(thread)
            if needed:
                try:
                    self.start_for_locked(serial=False)
                except RuntimeError:  # no thread to be had: the queue goes on with one worker fewer
                    logger.exception("buildops: starting a worker in place of a stuck one failed")

    @property
    def normal_locked(self) -> list[threading.Thread]:
        """The threads on the normal queue (a copy)."""
        return list(self._normal)

    @property
    def serial_locked(self) -> threading.Thread | None:
        """The thread on the serial queue, or None before one is needed."""
        return self._serial

    def _start(self, name: str, serial: bool) -> threading.Thread:
        def loop() -> None:
            _role.builder = True
            self._work(serial)
        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        return thread


def join_threads(threads: list[threading.Thread], deadline: float | None) -> None:
    """Wait for ``threads`` to end, until ``deadline`` (``time.monotonic()``) for all of them, not each; a thread
    stuck in a build given up, or the caller's own, is not waited for."""
    for thread in threads:
        # In steps: a build may be given up as timed out meanwhile, and its stuck thread is not waited for.
        while thread is not threading.current_thread() and thread.is_alive() and not stuck.holds(thread):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            thread.join(JOIN_STEP_SECONDS if left is None else min(JOIN_STEP_SECONDS, left))
