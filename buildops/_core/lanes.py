"""The builder's queue of normal builds: an urgent lane, served first, and a normal lane, first in, first out.

A build that someone is about to wait for (a serving call, above all) is moved to the urgent lane
(:meth:`Lanes.expedite_locked`), so it is the next one a free worker takes; the builds that no one waits for keep
their order behind it. Moving never touches a build a worker already took: that one runs (or is skipped, if
cancelled) where it is.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

__all__ = ["Lanes"]


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
