"""Temporary, reference-counted patches of third-party attributes.

buildops changes another library's function only where it must (to record launches, to serialise a step that is
not thread-safe upstream, to guard CUDA graph capture), and only while something needs it: a :class:`Patch` is
installed when its first holder acquires it and the original is put back when its last holder releases it.
Nothing is patched by importing buildops; :func:`applied` says what is patched now.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .state import runtime

__all__ = ["Patch", "applied"]


class Patch:
    """A replacement of ``owner.attribute`` made by ``make(original)``, held by reference count.

    Args:
        owner: the object whose attribute is replaced (a class or a module).
        attribute: the attribute's name.
        make: returns the replacement, given the original; called at each install.
        why: which upstream behaviour this works around, for which versions (shown by :func:`applied`).

    Contract: the replacement must behave as the original wherever buildops is not using it (another thread,
    another context), since it is seen process-wide while installed. Acquire and release in pairs; the patch is
    applied between the first acquire and the last release, and the attribute is restored exactly as it was.
    """

    def __init__(self, owner: Any, attribute: str, make: Callable[[Any], Any], why: str) -> None:
        self.owner, self.attribute, self.make, self.why = owner, attribute, make, why
        self.original: Any = None
        self._own = False  # whether the owner had the attribute itself (else it inherited it)
        self._holders = 0
        self._lock = threading.Lock()
        runtime.patches.add(self)

    def __repr__(self) -> str:
        name = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))
        return f"<Patch {name}.{self.attribute}: {self.why}>"

    @property
    def active(self) -> bool:
        return self._holders > 0

    def acquire(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._own = self.attribute in getattr(self.owner, "__dict__", {})
                self.original = getattr(self.owner, self.attribute)
                setattr(self.owner, self.attribute, self.make(self.original))
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            if self._holders == 0:
                raise RuntimeError(f"{self!r} released more often than acquired")
            self._holders -= 1
            if self._holders == 0:
                if self._own:
                    setattr(self.owner, self.attribute, self.original)
                else:  # inherited: deleting it shows the base's again, whatever the base has now
                    delattr(self.owner, self.attribute)
                self.original = None

    def forget_after_fork(self) -> None:
        """In a forked child: the lock may be held by a parent thread that is not there (see ``state``)."""
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Hold the patch for the block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()


def applied() -> list[Patch]:
    """The patches installed now."""
    return [patch for patch in list(runtime.patches) if isinstance(patch, Patch) and patch.active]
