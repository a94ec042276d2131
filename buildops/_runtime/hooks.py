"""Hooks the layers above fill and the layers below run, so that a lower layer never imports an upper one.

``on_shutdown`` runs at :func:`buildops.shutdown`, after the builder's workers stopped, with ``(wait, deadline)``:
``wait`` as given to shutdown, ``deadline`` the ``time.monotonic()`` its timeout ends at, or None (worker pools stop
there). ``on_reset`` runs at :func:`buildops.testing.reset`, with no arguments (a backend forgets what it noted).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Hooks", "on_reset", "on_shutdown"]

C = TypeVar("C", bound=Callable[..., Any])


class Hooks:
    """An ordered set of callbacks. Contract for a callback: quick, and it raises only for a real failure."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._callbacks: list[Callable[..., Any]] = []  # no lock: list operations are atomic, and a fork keeps them

    def add(self, callback: C) -> C:
        """Add ``callback`` (once; usable as a decorator)."""
        if callback not in self._callbacks:
            self._callbacks.append(callback)
        return callback

    def run(self, *args: Any) -> None:
        for callback in list(self._callbacks):
            callback(*args)


on_shutdown = Hooks("shutdown")
on_reset = Hooks("reset")
