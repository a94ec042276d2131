"""What an op's serving calls may still wait for: the futures of its builds in flight, by call signature and by
swept shape, and the sweeps still listing (:mod:`.sweeps`). One :class:`PendingBuilds` per op; thread-safe.

The op's wrapper reads the truth of :attr:`PendingBuilds.futures` (in C, on every call outside a pass), so that a
call with nothing pending goes straight to the function: the dict is never rebound.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Hashable

from .default import current_builder
from .sweeps import Sweep

__all__ = ["PendingBuilds", "Shape"]

Shape = tuple  # a swept shape's dims as sorted items (``passes.shape_key``)
Futures = list[concurrent.futures.Future]


class PendingBuilds:
    """The builds one op's calls may wait for (see the module docstring)."""

    def __init__(self) -> None:
        self.futures: dict[Hashable, Futures] = {}  # every pending future by signature; never rebound
        # The same futures by swept shape, and, once a call asked, by a shape the sweep did not hold: a serving
        # call waits for its own shape's builds only.
        self._shapes: dict[Hashable, dict[Shape, Futures]] = {}
        self._sweeps: dict[Hashable, Sweep] = {}  # first calls' sweeps whose rest is still to be listed
        self._lock = threading.Lock()

    def has(self, signature: Hashable) -> bool:
        with self._lock:
            return signature in self.futures

    def of(self, signature: Hashable) -> tuple[Futures, dict[Shape, Futures] | None]:
        """Every pending future of ``signature``, and the signature's futures by shape (None: none kept)."""
        with self._lock:
            return list(self.futures.get(signature, ())), self._shapes.get(signature)

    def of_shape(self, signature: Hashable, shape: Shape) -> Futures | None:
        """The futures listed for ``shape`` of ``signature``; None where none were listed for it."""
        with self._lock:
            return self._shapes.get(signature, {}).get(shape)

    def keep_shape(self, signature: Hashable, shape: Shape, futures: Futures) -> None:
        """Remember what a call's own listing found ``shape`` needs (a shape the sweep did not hold)."""
        with self._lock:
            shapes = self._shapes.get(signature)
            if shapes is not None:
                shapes[shape] = futures

    def note(self, signature: Hashable, by_shape: dict[Shape, Futures],
             listing: concurrent.futures.Future | None = None) -> None:
        """Futures a pass took for ``signature``, by shape; ``listing`` (a sweep's) is pending too, so that calls
        look for their shape while the sweep lists."""
        builder = current_builder()
        if builder is None:
            return
        futures = [f for listed in by_shape.values() for f in listed]
        if listing is not None:
            futures.append(listing)
        with self._lock:
            self.futures.setdefault(signature, []).extend(futures)
            shapes = self._shapes.setdefault(signature, {})
            for shape, listed in by_shape.items():
                shapes.setdefault(shape, []).extend(listed)
            builder.waiting_ops.add(self)
        for future in futures:  # outside the lock: a done future runs its callback right here
            future.add_done_callback(functools.partial(self._settle, signature))

    def _settle(self, signature: Hashable, _future: concurrent.futures.Future) -> None:
        with self._lock:
            futures = self.futures.get(signature)
            if futures is not None and all(f.done() for f in futures):
                del self.futures[signature]
                self._shapes.pop(signature, None)
            if not self.futures:
                builder = current_builder()
                if builder is not None:
                    builder.waiting_ops.discard(self)

    # -- sweeps still listing ------------------------------------------------------------------------------------

    def sweep(self, signature: Hashable) -> Sweep | None:
        with self._lock:
            return self._sweeps.get(signature)

    def has_sweep(self, signature: Hashable) -> bool:
        with self._lock:
            return signature in self._sweeps

    def add_sweep(self, signature: Hashable, sweep: Sweep) -> None:
        with self._lock:
            self._sweeps[signature] = sweep
        sweep.done.add_done_callback(functools.partial(self._sweep_listed, signature, sweep))

    def _sweep_listed(self, signature: Hashable, sweep: Sweep, _: concurrent.futures.Future) -> None:
        with self._lock:
            if self._sweeps.get(signature) is sweep:
                del self._sweeps[signature]

    def forget_pending(self) -> None:
        """Drop every pending future and sweep (the builder that owned them is gone: shut down, or in a forked
        child)."""
        self._lock = threading.Lock()  # after a fork the parent's lock may be held by a thread that is gone
        self.futures.clear()  # not a new dict: the op's wrapper reads this one's truth
        self._shapes = {}
        self._sweeps = {}
