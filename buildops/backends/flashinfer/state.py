"""The FlashInfer backend's process-wide state, in one object (:data:`flashinfer_state`): what its modules keep
between calls, what ``buildops.testing.reset()`` makes it forget (:meth:`FlashInferState.reset`) and what a forked
child drops (:meth:`FlashInferState.after_fork`).

Imports no FlashInfer: the patches it releases at a reset it asks to release themselves.
"""

from __future__ import annotations

import threading

from ..._runtime.forking import forget_in_child
from ..._runtime.hooks import on_reset
from ..._runtime.patching import Patch

__all__ = ["FlashInferState", "flashinfer_state"]


class FlashInferState:
    """Every piece of the FlashInfer backend's mutable process-wide state; one instance, :data:`flashinfer_state`."""

    def __init__(self) -> None:
        # build_patch: the patches of ``JitSpec.build`` held until a reset, in the order taken (released in reverse)
        self.build_patches: list[Patch] = []
        # build_patch: the purposes they were taken for, each once
        self.build_patch_purposes: set[str] = set()
        self.build_patch_lock = threading.Lock()
        # builds: the slots that bound how many module builds run at once, made at the first build (when
        # settings.threads is known)
        self.build_slots: threading.BoundedSemaphore | None = None
        self.build_slots_lock = threading.Lock()

    def reset(self) -> None:
        """Release the patches of ``JitSpec.build``, last taken first, and forget their purposes: what
        ``buildops.testing.reset()`` must forget."""
        with self.build_patch_lock:
            for patch in reversed(self.build_patches):
                patch.release()
            self.build_patches.clear()
            self.build_patch_purposes.clear()

    def after_fork(self) -> None:
        """In a forked child (its only thread; the parent's locks possibly held): new locks, and no build slots (those
        the parent's build threads hold would never be given back here; the child's first build makes its own)."""
        self.build_patch_lock = threading.Lock()
        self.build_slots, self.build_slots_lock = None, threading.Lock()


flashinfer_state = FlashInferState()
forget_in_child(flashinfer_state.after_fork)
on_reset.add(flashinfer_state.reset)
