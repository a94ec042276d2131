"""FlashInfer's ``JitSpec.build`` as buildops patches it, held until ``buildops.testing.reset()``.

Two patches may wrap it at once: the late-compile watch (:mod:`.builds`) and the skip of modules installed from
the build store (:mod:`.store`). Each wraps whatever it finds, so they are released in the reverse order
of their taking: released in any other order, the first would put the original back under the second, and the
second would then put the first's wrapper back for good.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..._runtime.forking import free_in_child
from ..._runtime.hooks import on_reset
from ..._runtime.patching import Patch

__all__ = ["hold"]

_held: list[Patch] = []  # in the order taken
_purposes: set[str] = set()
_lock = free_in_child(threading.Lock())


def hold(purpose: str, classes: Iterable[type], make: Callable[[Any], Any], why: str) -> None:
    """Wrap ``build`` of each of ``classes`` that defines it with ``make(original)``, once per ``purpose``, until
    ``buildops.testing.reset()``. ``why`` is the :class:`Patch`'s reason."""
    with _lock:  # two threads may want one purpose at once (two passes ending, two installs)
        if purpose in _purposes:
            return
        _purposes.add(purpose)
        for cls in classes:
            if "build" in cls.__dict__:
                patch = Patch(cls, "build", make, why)
                patch.acquire()
                _held.append(patch)


@on_reset.add
def _release() -> None:
    with _lock:
        for patch in reversed(_held):
            patch.release()
        _held.clear()
        _purposes.clear()
