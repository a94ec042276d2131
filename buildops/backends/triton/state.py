"""The Triton backend's process-wide state, in one object (:data:`triton_state`): what its modules keep between
calls, what ``buildops.testing.reset()`` makes it forget (:meth:`TritonState.reset`) and what a forked child drops
(:meth:`TritonState.after_fork`).

Imports neither torch nor Triton: the worker processes and ``startup`` use it before either is imported. What a
lifecycle step must do to an object of Triton's (release a patch) it asks of the object itself.

Left in their modules: the locks that only serialise a step (``build``'s ``_triton_key_lock`` and ``_load_lock``,
``driver``'s ``_driver_lock``, ``patches``' parse and module-load locks, ``interpret``'s ``_twins_lock``), each made
free in a child where it is made; the patches ``record`` makes at import; and the worker pool (``worker.workers``),
which registers its own lifecycle.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from typing import Any

from ..._runtime.forking import forget_in_child
from ..._runtime.hooks import on_reset
from ..._runtime.patching import Patch

__all__ = ["TritonState", "triton_state"]


class TritonState:
    """Every piece of the Triton backend's mutable process-wide state; one instance, :data:`triton_state`."""

    def __init__(self) -> None:
        # startup: whether this process began preparing builds (the CUDA helper's build, the install's hash), which
        # lasts for the process, and the lock that makes two starts prepare once
        self.prepared = False
        self.prepare_lock = threading.Lock()
        # record: the patch of ``Autotuner.run`` that serve_after_passes holds beyond recordings, or None
        self.serving_patch: Patch | None = None
        self.serving_lock = threading.Lock()
        # record: a patch of ``run`` per library subclass of ``Autotuner`` that overrides it, made once per class
        self.tuner_class_patches: dict[type, Patch] = {}
        # record, pending: the recording of this context (a ``pending.Recorder``): where launches go, or None
        self.recording: contextvars.ContextVar[Any] = contextvars.ContextVar("buildops_triton", default=None)
        # serving: (kernel, key) whose tuning a serving launch asked for (each recorded as late once)
        self.tunings_queued: set[tuple] = set()
        self.tunings_queued_lock = threading.Lock()
        # late: kernel -> the ops that listed builds of it, named by a late compile
        self.listed: dict[str, set[str]] = {}
        self.listed_lock = threading.Lock()
        # build: one lock per launcher signature, taken by the thread that makes that launcher
        self.launcher_locks: dict[str, threading.Lock] = {}
        self.launcher_locks_lock = threading.Lock()
        # patches: the patches this Triton needs held while building, found at the first build
        self.build_patches: list[Patch] | None = None
        self.build_patches_lock = threading.Lock()
        # interpret: the patch of ``InterpretedFunction.run`` that records launches, made at first need
        self.interpreter_patch: Patch | None = None
        self.interpreter_patch_lock = threading.Lock()
        # entries: ``.entries``, the set of cache entries this thread's ``collecting`` block fills, or None
        self.noted_entries = threading.local()
        # worker: ``.compiles``, what this thread's ``watching_compiles`` block saw, or None outside one
        self.watched_compiles = threading.local()
        # worker: the (backend, arch, warp size) this process compiles for, once ``use_target`` set it
        self.worker_target: tuple[str, int, int] | None = None
        # worker: the target a first compile here (or in the forkserver this worker was forked from) was for
        self.warmed_for: tuple[str, int, int] | None = None
        # shipping: per kernel, (its cache key, how it travels or why it cannot, what the description read)
        self.described: weakref.WeakKeyDictionary[Any, tuple[str, Any, list]] = weakref.WeakKeyDictionary()
        # shipping, in a worker: (root, cache key) -> the kernel rebuilt from source, reused by later variants
        self.rebuilt: dict[tuple[str, str], Any] = {}

    def reset(self) -> None:
        """Forget which ops listed which kernels and which tunings serving queued, and stop serving after passes
        (release the patch of ``Autotuner.run``): what ``buildops.testing.reset()`` must forget."""
        with self.listed_lock:
            self.listed.clear()
        with self.tunings_queued_lock:
            self.tunings_queued.clear()
        with self.serving_lock:
            held, self.serving_patch = self.serving_patch, None
        if held is not None:
            held.release()

    def after_fork(self) -> None:
        """In a forked child (its only thread; the parent's locks possibly held): new locks; no preparation (the
        parent's thread is not here: a child that starts workers prepares again, cheaply); no launcher locks (a
        child makes its own launchers). What a worker warmed for in its forkserver it keeps."""
        self.build_patches_lock = threading.Lock()
        self.interpreter_patch_lock = threading.Lock()
        self.prepared, self.prepare_lock = False, threading.Lock()
        self.serving_lock = threading.Lock()
        self.tunings_queued_lock = threading.Lock()
        self.listed_lock = threading.Lock()
        self.launcher_locks, self.launcher_locks_lock = {}, threading.Lock()


triton_state = TritonState()
forget_in_child(triton_state.after_fork)
on_reset.add(triton_state.reset)
