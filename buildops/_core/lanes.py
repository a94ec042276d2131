"""The builder's queues: :class:`Lanes` for normal builds, :class:`SerialQueue` for serial ones.

Normal builds have an urgent lane, served first, and a normal lane, first in, first out. A build that someone is
about to wait for (a serving call, above all) is moved to the urgent lane (:meth:`Lanes.expedite_locked`), so it is
the next one a free worker takes; the builds that no one waits for keep their order behind it. Moving never touches
a build a worker already took: that one runs (or is skipped, if cancelled) where it is.

Serial builds (autotuning, which times kernels on the GPU) run one at a time, each once the normal builds it names
(``Build.after``) are done, on a worker of their own beside the compiles and without holding a compile worker. The
worker takes the first serial build, in submission order, whose ``after`` builds are done, so it never idles on one
build's compiles while another could run; one that waited ``AFTER_WAIT_SECONDS`` runs regardless, and copes with
what is missing. A serial build may wait for normal builds, never the reverse
(docs/decisions/0014-autotuning-in-the-build.md).

A serial build that a serving call waits for is expedited: it moves ahead of the others, and while it waits for its
``after`` builds (which the builder expedites with it) the worker takes no build that is not urgent, so that no
other tune holds the worker when those are done (docs/decisions/0016-serving-first.md).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["AFTER_WAIT_SECONDS", "Lanes", "SerialQueue"]


class _Queued(Protocol):
    urgent: bool

    def __hash__(self) -> int: ...


Q = TypeVar("Q", bound=_Queued)


class Lanes(Generic[Q]):
    """Two lanes of items for worker threads, urgent first. It shares its owner's lock through ``changed`` (a
    condition on that lock, used by nothing else): every method ending in ``_locked`` is called with it held.

    Contract:
      * ``take`` returns the oldest item of the urgent lane, else of the normal lane, and blocks while both are
        empty. None is a stop: it is put in the normal lane, behind what is queued, once per worker to stop.
      * An item marked ``urgent`` goes to the urgent lane whenever it is put, so an urgent item a worker puts back
        (another process of the node builds its key) stays ahead of the rest.
      * ``expedite_locked`` marks items urgent, those waiting in the normal lane and those out of both (taken by a
        worker, maybe to be put back), and moves the waiting ones to the end of the urgent lane, in their order.
    """

    def __init__(self, changed: threading.Condition) -> None:
        self._changed = changed
        self._urgent: deque[Q] = deque()
        self._normal: deque[Q | None] = deque()

    def put_locked(self, item: Q | None) -> None:
        if item is not None and item.urgent:
            self._urgent.append(item)
        else:
            self._normal.append(item)
        self._changed.notify()  # one item: one worker

    def put(self, item: Q | None) -> None:
        with self._changed:
            self.put_locked(item)

    def take(self) -> Q | None:
        with self._changed:
            while not (self._urgent or self._normal):
                self._changed.wait()
            return self._urgent.popleft() if self._urgent else self._normal.popleft()

    def expedite_locked(self, items: Iterable[Q]) -> int:
        """Mark ``items`` urgent and move those waiting in the normal lane to the urgent one; return how many
        moved. Items already urgent are left where they are."""
        fresh = {item: None for item in items if not item.urgent}  # a dict: one of each, in order
        if not fresh:
            return 0  # a serving call that waits again for what it expedited costs no look at the lane
        for item in fresh:
            item.urgent = True
        moved = [item for item in self._normal if item is not None and item in fresh]
        if moved:
            self._normal = deque(item for item in self._normal if item is None or item not in fresh)
            self._urgent.extend(moved)
        return len(moved)


# A serial build whose ``after`` builds are not all done runs anyway once it has waited this long (a compile that
# another process of the node holds a claim on can take long).
AFTER_WAIT_SECONDS = 120.0
# How often a waiting worker looks again on its own: an owner cancelling a future itself notifies no one.
RECHECK_SECONDS = 1.0


class _SerialQueued(Protocol):
    queued: float
    urgent: bool
    build: Any
    future: Any


S = TypeVar("S", bound=_SerialQueued)


class SerialQueue(Generic[S]):
    """Serial records waiting for their turn. It shares its owner's lock through ``changed`` (a condition on that
    lock), which the owner notifies when a build is done or cancelled, or it closes; ``done_locked(key)`` says
    whether a key counts as done (never submitted, cancelled or settled)."""

    def __init__(self, changed: threading.Condition, done_locked: Callable[[Hashable], bool],
                 closed: Callable[[], bool]) -> None:
        self._changed, self._done_locked, self._closed = changed, done_locked, closed
        self.pending: list[S] = []  # in submission order, under the lock

    def put_locked(self, record: S) -> None:
        record.queued = time.monotonic()
        # Urgent records stay ahead of the others, in their order: one put back stays urgent.
        at = self._first_normal() if record.urgent else len(self.pending)
        self.pending.insert(at, record)
        self._changed.notify_all()

    def put(self, record: S) -> None:
        with self._changed:
            self.put_locked(record)

    def take(self) -> S | None:
        """The serial record to run next, or None once the owner is closed and nothing is pending."""
        with self._changed:
            while True:
                if self._closed() and not self.pending:
                    return None
                if not self.pending:
                    self._changed.wait()  # until a serial build is queued, or the owner closes
                    continue
                urgent_waits = any(r.urgent and not r.future.cancelled() for r in self.pending)
                for record in self.pending:
                    if record.future.cancelled():
                        break  # taken to be skipped
                    if (record.urgent or not urgent_waits) and all(self._done_locked(k) for k in record.build.after):
                        break
                else:
                    oldest = self.pending[0]  # urgent, where one waits: urgent records come first
                    patience = AFTER_WAIT_SECONDS - (time.monotonic() - oldest.queued)
                    if patience > 0:
                        self._changed.wait(timeout=min(patience, RECHECK_SECONDS))
                        continue
                    record = oldest
                self.pending.remove(record)
                return record

    def expedite_locked(self, record: S) -> bool:
        """Mark ``record`` urgent and, if it waits here, move it behind the urgent records, ahead of the others;
        True if it moved. A record already urgent is left where it is."""
        if record.urgent:
            return False
        record.urgent = True
        if record not in self.pending:
            return False  # running, or taken to run
        self.pending.remove(record)
        self.pending.insert(self._first_normal(), record)
        self._changed.notify_all()  # the worker may be waiting for another record's builds
        return True

    def _first_normal(self) -> int:
        return next((i for i, r in enumerate(self.pending) if not r.urgent), len(self.pending))
