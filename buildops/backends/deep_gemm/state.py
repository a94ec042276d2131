"""The DeepGEMM backend's process-wide state, in one object (:data:`deep_gemm_state`): what its modules keep between
calls, what ``buildops.testing.reset()`` makes it forget (:meth:`DeepGemmState.reset`) and what a forked child
drops (:meth:`DeepGemmState.after_fork`).

Imports neither torch nor DeepGEMM: the patches it releases at a reset it asks to release themselves. The worker
pool (``workers.pool``) registers its own lifecycle.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ..._runtime.forking import forget_in_child
from ..._runtime.hooks import on_reset
from ..._runtime.patching import Patch

__all__ = ["DeepGemmState", "deep_gemm_state"]

# The module the late-compile watch wraps from the start; a build adds the module it runs.
_FIRST_WATCHED = "deep_gemm"


class DeepGemmState:
    """Every piece of the DeepGEMM backend's mutable process-wide state; one instance, :data:`deep_gemm_state`."""

    def __init__(self) -> None:
        # entries: the DeepGEMM builds and store installs of this process under way now, and begun ever (a late
        # compile seen while one ran may be its)
        self.making_now = 0
        self.making_ever = 0
        self.making_lock = threading.Lock()
        # entries: what each cache entry's kernel was made of (None: not read), by entry, under making_lock
        self.entry_kernels: dict[str, dict[str, str] | None] = {}
        # late: the modules whose entry points the watch wraps at the end of a pass
        self.watched_modules: set[str] = {_FIRST_WATCHED}
        # late: the patches of those entry points held until a reset, by (module, function)
        self.watch_patches: dict[tuple[str, str], Patch] = {}
        # late: each cache directory as last listed: directory -> (its stat, its entries)
        self.watch_listed: dict[Path, tuple[Any, frozenset[str]]] = {}
        # late: kernel -> the ops whose builds made entries of it, named by a late compile
        self.built_by: dict[str, set[str]] = {}
        # late: the one lock of the four above
        self.watch_lock = threading.Lock()
        # knobs, in a worker: module -> its settings as this process first found them (a build that gives none of
        # one gets this back)
        self.worker_defaults: dict[str, dict[str, Any]] = {}
        # workers: how the worker pool was sized (``workers.Sizing``), each time it starts; the builds using the pool
        # now, and the timer that stops its workers once none has for a while; the one lock of the three
        self.sizing: Any = None
        self.runs_in_pool = 0
        self.idle_timer: threading.Timer | None = None
        self.sizing_lock = threading.Lock()

    def reset(self) -> None:
        """Stop watching for late compiles (release the patches), forget what the watch noted and how the worker
        pool was sized: what ``buildops.testing.reset()`` must forget."""
        with self.watch_lock:
            for patch in self.watch_patches.values():
                patch.release()
            self.watch_patches.clear()
            self.watched_modules = {_FIRST_WATCHED}
            self.watch_listed.clear()
            self.built_by.clear()
        with self.sizing_lock:
            self.sizing = None
            if self.idle_timer is not None:
                self.idle_timer.cancel()
                self.idle_timer = None

    def after_fork(self) -> None:
        """In a forked child (its only thread; the parent's locks possibly held): new locks, and no builds under
        way (a child runs none of its parent's)."""
        self.making_lock = threading.Lock()
        self.making_now = self.making_ever = 0
        self.watch_lock = threading.Lock()
        # the parent's workers, and their timer, are not the child's
        self.sizing, self.runs_in_pool, self.idle_timer, self.sizing_lock = None, 0, None, threading.Lock()


deep_gemm_state = DeepGemmState()
forget_in_child(deep_gemm_state.after_fork)
on_reset.add(deep_gemm_state.reset)
