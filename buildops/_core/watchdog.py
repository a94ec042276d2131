"""Giving up builds that run past ``BUILDOPS_BUILD_TIMEOUT``, and the runs given up that still run.

A thread cannot be stopped. So a build past its deadline is *given up*: its future fails at once, so that the
op's calls and joins stop waiting for it, a worker takes the stuck one's place, and when the run returns at last
its outcome is dropped. Given-up runs that still run are kept process-wide (:data:`stuck`): a GPU one among them
must keep refusing CUDA graph capture, even after its builder was shut down
(docs/decisions/0012-build-timeout-watchdog.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from .build import Build
from .state import core

__all__ = ["Watchdog", "abandon", "stuck"]

logger = logging.getLogger("buildops")


class _Watched(Protocol):
    deadline: float | None
    build: Build
    thread: threading.Thread | None


R = TypeVar("R", bound=_Watched)


class Watchdog(Generic[R]):
    """A thread that sleeps until the earliest deadline of the runs it watches, then gives up those past it.

    It shares its owner's lock through ``changed`` (a condition on that lock): every method ending in ``_locked``
    is called with it held. ``give_up_locked(record)`` marks a record given up, under the lock, and returns the
    error for its future; ``after(record, error)`` then runs outside the lock (futures' callbacks run there).
    It ends once ``closed()`` and nothing is watched.
    """

    def __init__(self, changed: threading.Condition, give_up_locked: Callable[[R], BaseException],
                 after: Callable[[R, BaseException], None], closed: Callable[[], bool]) -> None:
        self._changed, self._give_up_locked, self._after, self._closed = changed, give_up_locked, after, closed
        self.running: set[R] = set()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether its thread runs (it starts with the first run that has a deadline)."""
        return self._thread is not None

    def watch_locked(self, record: R) -> None:
        self.running.add(record)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="buildops-watchdog", daemon=True)
            self._thread.start()
        self._changed.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait until its thread has ended (it ends once ``closed()`` and nothing is watched), at most ``timeout``
        seconds."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def unwatch_locked(self, record: R) -> None:
        if record in self.running:
            self.running.discard(record)
            self._changed.notify_all()  # it may be waiting for the last run to end

    def _watch(self) -> None:
        while True:
            with self._changed:
                if self._closed() and not self.running:
                    self._thread = None
                    return
                now = time.monotonic()
                given_up = []
                for record in [r for r in self.running if r.deadline is not None and r.deadline <= now]:
                    self.running.discard(record)
                    try:
                        given_up.append((record, self._give_up_locked(record)))
                    except Exception:  # one record must not stop the watchdog for the others
                        logger.exception("buildops: giving up a timed-out build failed")
                if not given_up:
                    soonest = min((r.deadline for r in self.running if r.deadline is not None), default=None)
                    wait = None if soonest is None else min(soonest - now, threading.TIMEOUT_MAX)
                    self._changed.wait(wait)
                    continue
            for record, error in given_up:
                self._after(record, error)


stuck = core.stuck  # the given-up runs that still run, of every builder of this process


def stuck_gpu_builds() -> list[Build]:
    """GPU builds given up as timed out whose runs have not returned, on any builder of this process: no join
    waits for them, and a CUDA graph capture must not begin beside them."""
    return stuck.gpu_builds()


def abandon(build: Build) -> None:
    """Call a given-up build's ``abandon``, if it has one (see :class:`~.build.Build`), on a thread of its
    own: it may block, and the watchdog must not."""
    stop = build.abandon
    if stop is not None:
        threading.Thread(target=_abandon, args=(build, stop), name="buildops-abandon", daemon=True).start()


def _abandon(build: Build, stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # the build is given up already; its stuck run stays stuck
        logger.warning("buildops: stopping given-up build %s failed", build.describe(), exc_info=True)
