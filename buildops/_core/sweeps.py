"""The rest of a sweep, listed after the pass's body rather than on the engine's thread during it.

A first call in a pass lists its own shape at once: its builds start, and the pass knows them as called. An op
listed by replay pays a replay of its host code for each other shape of its sweep, Python that holds the GIL
(thousands of them are seconds of a start). Those shapes wait in a :class:`Sweep` until the pass's body ends, and
are then listed:
  * at the end of a :func:`~buildops.build_pass`, before it waits for its builds (the called shapes build
    meanwhile);
  * after a :func:`~buildops.rehearsal`, on a background thread (``buildops-lister``), beside what the engine does
    next (the checkpoint load);
  * on the thread of a call that needs one of its shapes first (a later call of the pass at that shape, a serving
    call waiting for its builds): that shape, there and then.

:func:`wait_for_sweeps` waits until every sweep handed to a background thread is listed (``buildops.join`` does).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

from .state import core

__all__ = ["Sweep", "list_later", "listing", "wait_for_sweeps"]

logger = logging.getLogger("buildops")

# Set while a sweep lists a shape: a decorated op its replay calls then runs its host code (its launches are recorded
# into the listing) rather than wait for builds of its own
_listing: contextvars.ContextVar[bool] = contextvars.ContextVar("buildops_listing_sweep", default=False)


def listing() -> bool:
    """Whether this thread is listing a shape of a sweep."""
    return _listing.get()


class Sweep:
    """The shapes of one first call's sweep not listed yet.

    ``list_shape(dims)`` lists one shape and queues its builds (the op's, with the first call's arguments);
    ``done`` is a future that completes once every shape has been listed or the sweep was dropped. Each shape is
    listed once, by whichever thread asks first; another thread asking for it meanwhile waits for that listing.
    """

    def __init__(self, op: str, owner: object, list_shape: Callable[[Mapping[str, int]], object],
                 shapes: Iterable[Mapping[str, int]]) -> None:
        self.op = op
        self.owner = owner  # the pass whose first call made it: a pass that raises drops the sweeps it made
        self._list_shape = list_shape
        self._left: dict[Hashable, Mapping[str, int]] = {_key(dims): dims for dims in shapes}
        self._listing: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._finished = False
        self._dropped = False
        self._settle()

    def list(self, dims: Mapping[str, int]) -> None:
        """List the shape ``dims`` now if it is still to be listed, or wait for the thread listing it; nothing for
        a shape the sweep does not hold. What the listing raises is raised here."""
        key = _key(dims)
        with self._lock:
            left = self._left.pop(key, None)
            if left is not None:
                self._listing[key] = threading.Event()
            elsewhere = self._listing.get(key) if left is None else None  # another thread lists it now
        if left is not None:
            self._run(key, left)
        elif elsewhere is not None:
            elsewhere.wait()

    def list_rest(self) -> None:
        """List every shape still to be listed, in the sweep's order; a shape whose listing fails is logged and
        left to compile on first use."""
        while True:
            with self._lock:
                if not self._left:
                    return
                key = next(iter(self._left))
                dims = self._left.pop(key)
                self._listing[key] = threading.Event()
            try:
                self._run(key, dims)
            except Exception as error:
                if self._dropped:  # a shutdown, or a start that failed, while it listed: no one wants it
                    logger.debug("buildops: %s: listing a dropped sweep failed", self.op, exc_info=True)
                    return
                logger.warning("buildops: %s: listing its sweep at %s failed (%s: %s); that shape compiles on first "
                               "use", self.op, dict(dims), type(error).__name__, error)
                logger.debug("buildops: the failed listing of %s", self.op, exc_info=True)

    def drop(self) -> None:
        """List no more of it (shapes being listed now finish)."""
        with self._lock:
            self._left.clear()
            self._dropped = True
        self._settle()

    def _run(self, key: Hashable, dims: Mapping[str, int]) -> None:
        """List a shape this thread took (its event is in ``_listing``), then wake whoever waits for it."""
        token = _listing.set(True)
        try:
            self._list_shape(dims)
        finally:
            _listing.reset(token)
            with self._lock:
                event = self._listing.pop(key)
            event.set()
            self._settle()

    def _settle(self) -> None:
        with self._lock:
            finished = not self._left and not self._listing and not self._finished
            self._finished = self._finished or finished
        if finished:  # outside the lock: the future's callbacks run here
            self.done.set_result(None)


def _key(dims: Mapping[str, int]) -> Hashable:
    return tuple(sorted(dims.items()))


def list_later(sweeps: list[Sweep]) -> None:
    """List ``sweeps`` on a background thread, in order; :func:`wait_for_sweeps` waits for them."""
    sweeps = [sweep for sweep in sweeps if not sweep.done.done()]
    if not sweeps:
        return
    with core.handed_lock:
        core.handed_sweeps.update(sweeps)
    for sweep in sweeps:
        sweep.done.add_done_callback(_forget(sweep))
    threading.Thread(target=_list_all, args=(sweeps,), name="buildops-lister", daemon=True).start()


def _forget(sweep: Sweep) -> Callable[[concurrent.futures.Future[None]], None]:
    def forget(_: concurrent.futures.Future[None]) -> None:
        with core.handed_lock:
            core.handed_sweeps.discard(sweep)
    return forget


def _list_all(sweeps: list[Sweep]) -> None:
    for sweep in sweeps:
        sweep.list_rest()


def wait_for_sweeps(timeout: float | None = None) -> bool:
    """Wait until every sweep handed to a background thread is listed; False if ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with core.handed_lock:
            waiting = [sweep.done for sweep in core.handed_sweeps]
        if not waiting:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, pending = concurrent.futures.wait(waiting, timeout=left)
        if pending and deadline is not None and time.monotonic() >= deadline:
            return False
