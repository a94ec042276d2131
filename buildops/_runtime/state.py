"""The runtime layer's process-wide mutable state, in one object: :data:`runtime`.

Every module of the layer keeps what outlives one call here rather than in module globals, so that what a forked
child drops (:meth:`RuntimeState.after_fork`) and what a test's reset forgets (:meth:`RuntimeState.reset`) is each
said in one place. Objects of other modules that hold state of their own (a patch, a memory gate) are kept here by
weak reference and told to forget through a method of theirs, so this module imports no other module of the layer
but the two mechanisms it registers with (``forking``, ``hooks``), and never torch.

Not here: constants (a module's :class:`~.patching.Patch` objects, ``gpu.gate``: their bindings never change, and
their state is reached through :attr:`RuntimeState.patches` and :attr:`RuntimeState.gates`); memoised answers
(``toolchain.tool_version``); the registries of ``forking`` and ``hooks``; and each worker pool, which registers
itself (``pools``).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any, Protocol

from .forking import forget_in_child
from .hooks import on_reset

__all__ = ["ForgetsAfterFork", "RuntimeState", "runtime"]


class ForgetsAfterFork(Protocol):
    """An object with state of its own that a forked child must drop (a patch's lock, a gate's admitted builds)."""

    def forget_after_fork(self) -> None:
        """Called in a forked child's only thread: take no lock, replace them; never raise."""
        ...


class RuntimeState:
    """The runtime layer's process-wide mutable state; one instance, :data:`runtime`. Read a lock from here at each
    use, never keep it: :meth:`after_fork` replaces it."""

    def __init__(self) -> None:
        # patching: every Patch made (each keeps its own lock and holder count), for applied() and after a fork.
        self.patches: weakref.WeakSet[ForgetsAfterFork] = weakref.WeakSet()
        # gpu: every MemoryGate made (the process's own gate, and tests'), to be told to forget after a fork.
        self.gates: weakref.WeakSet[ForgetsAfterFork] = weakref.WeakSet()
        # gpu: per thread, .by_device: that worker thread's own CUDA stream on each device.
        self.worker_streams = threading.local()
        # children: per thread, .started: the Started of the building() block running on that thread, or None.
        self.children_here = threading.local()
        # children: the Started of every building() block running now, on any thread.
        self.children_running: set[Any] = set()
        # children: guards children_running and children_exit_hooked.
        self.children_lock = threading.Lock()
        # children: whether kill_all is registered to run at exit (a child forked since inherits the registration).
        self.children_exit_hooked = False
        # gil: guards the three gil_ fields below.
        self.gil_lock = threading.Lock()
        # gil: how many hold the short switch interval now.
        self.gil_holders = 0
        # gil: the switch interval before the first holder, if a holder changed it.
        self.gil_restore_to: float | None = None
        # gil: the switch interval as set by a holder, as the interpreter stores it (whole microseconds).
        self.gil_ours: float | None = None
        # node: the lock directories already warned about as unusable (once per directory, not once per build).
        self.warned_directories: set[str] = set()
        # turns: per thread, .urgent: how the build that thread runs tells whether it is urgent now.
        self.urgency_here = threading.local()
        # main_module: per thread, .workers: whether that thread is starting one of buildops' worker processes.
        self.starting_workers = threading.local()

    def reset(self) -> None:
        """What ``buildops.testing.reset()`` forgets: nothing in this layer. Patches and the switch interval are
        held and let go in pairs, builds' compilers are noted only while a build runs, and a warning already given
        about a directory stays given."""

    def after_fork(self) -> None:
        """In a forked child's only thread, with the parent's locks possibly held by threads that are not there:
        take no lock, replace them, drop what those threads held. Never raises."""
        # No build runs in the child, so none of its compilers is the child's to kill.
        self.children_lock = threading.Lock()
        self.children_running = set()
        self.children_here.__dict__.pop("started", None)  # the forking thread's block, if any
        # The holders of the short switch interval were the parent's threads: the child starts with the interval
        # there was before them, unless someone else set another.
        self.gil_lock = threading.Lock()
        if self.gil_restore_to is not None and sys.getswitchinterval() == self.gil_ours:
            sys.setswitchinterval(self.gil_restore_to)
        self.gil_holders, self.gil_restore_to, self.gil_ours = 0, None, None
        # Last, each on its own: these run code of other modules, and one that fails must not stop the rest.
        for held in (*self.patches, *self.gates):
            try:
                held.forget_after_fork()
            except Exception:  # noqa: BLE001 - logging may itself deadlock in a fresh child; the others still run
                pass


runtime = RuntimeState()

forget_in_child(runtime.after_fork)
on_reset.add(runtime.reset)
