"""Turns at a pool of worker processes: who goes first where more builds call a pool than it has workers.

A ``ProcessPoolExecutor`` runs the calls it is given first in, first out, so a build that a serving call waits for
(docs/decisions/0016-serving-first.md) would wait there behind every call made before it. Triton's pool has as many
workers as a builder has threads by default, but a pool may admit fewer calls (DeepGEMM's: as many as free GPU
memory holds CUDA contexts), and a builder may be made with more threads. So a pool hands out as many turns as it
admits calls: a call waits for a turn, not in the executor's queue, and a turn that comes free goes to the first
waiting call whose build is urgent, else to the oldest.

A builder says around each build's run how to tell whether that build is urgent (:func:`urgency`); it is asked
each time a turn is handed out, so a build expedited while it waits goes first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from .state import runtime

__all__ = ["Turns", "is_urgent", "urgency"]


@contextlib.contextmanager
def urgency(urgent: Callable[[], bool]) -> Iterator[None]:
    """Within the block, a call to a worker pool on this thread asks ``urgent()`` whether it goes first. It is
    called under the pool's lock: it must be quick and never raise."""
    before = getattr(runtime.urgency_here, "urgent", None)
    runtime.urgency_here.urgent = urgent
    try:
        yield
    finally:
        runtime.urgency_here.urgent = before


def _not_urgent() -> bool:
    return False


def is_urgent() -> bool:
    """Whether the build this thread runs is urgent now (a caller waits for it), as its builder says."""
    urgent = getattr(runtime.urgency_here, "urgent", None)
    return urgent is not None and urgent()


class _Waiter:
    __slots__ = ("admitted", "urgent")

    def __init__(self, urgent: Callable[[], bool]) -> None:
        self.urgent, self.admitted = urgent, False


class Turns:
    """At most ``limit`` calls hold a turn at once; a turn that comes free goes to the first waiting call that is
    urgent, else to the oldest. The limit is 0, so every call waits, until the pool sets it as it starts."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._limit = 0
        self._held = 0
        self._waiting: list[_Waiter] = []

    def set_limit(self, limit: int) -> None:
        with self._changed:
            self._limit = limit
            self._hand_out_locked()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold a turn for the block, once one is handed to this call."""
        waiter = _Waiter(getattr(runtime.urgency_here, "urgent", None) or _not_urgent)
        with self._changed:
            self._waiting.append(waiter)
            self._hand_out_locked()
            try:
                self._changed.wait_for(lambda: waiter.admitted)
            except BaseException:  # interrupted while it waited: its turn, if handed out meanwhile, goes on
                if waiter.admitted:
                    self._held -= 1
                    self._hand_out_locked()
                else:
                    self._waiting.remove(waiter)
                raise
        try:
            yield
        finally:
            with self._changed:
                self._held -= 1
                self._hand_out_locked()

    def _hand_out_locked(self) -> None:
        handed = False
        while self._waiting and self._held < self._limit:
            waiter = next((w for w in self._waiting if w.urgent()), self._waiting[0])
            self._waiting.remove(waiter)
            waiter.admitted, handed = True, True
            self._held += 1
        if handed:
            self._changed.notify_all()
