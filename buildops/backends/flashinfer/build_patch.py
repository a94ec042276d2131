"""FlashInfer's ``JitSpec.build`` as buildops patches it, held until ``buildops.testing.reset()``.

Two patches may wrap it at once: the late-compile watch (:mod:`.builds`) and the skip of modules installed from
the build store (:mod:`.store`). Each wraps whatever it finds, so they are released in the reverse order
of their taking: released in any other order, the first would put the original back under the second, and the
second would then put the first's wrapper back for good.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..._runtime.patching import Patch
from .state import flashinfer_state

__all__ = ["hold"]


def hold(purpose: str, classes: Iterable[type], make: Callable[[Any], Any], why: str) -> None:
    """Wrap ``build`` of each of ``classes`` that defines it with ``make(original)``, once per ``purpose``, until
    ``buildops.testing.reset()`` (``flashinfer_state.reset``, which releases them in reverse). ``why`` is the
    :class:`Patch`'s reason."""
    state = flashinfer_state
    with state.build_patch_lock:  # two threads may want one purpose at once (two passes ending, two installs)
        if purpose in state.build_patch_purposes:
            return
        state.build_patch_purposes.add(purpose)
        for cls in classes:
            if "build" in cls.__dict__:
                patch = Patch(cls, "build", make, why)
                patch.acquire()
                state.build_patches.append(patch)
