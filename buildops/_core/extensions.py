"""What backends provide to the core, registered by name so that the core imports no backend.

Each entry is ``"module:attribute"``, imported only when the core first needs it, and only where the library it
serves is in use: registering imports nothing. ``buildops.backends`` registers the backends that ship with
buildops; another package may register its own the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Extension", "add_first_gpu_build_hook", "add_launch_recorder", "add_late_watcher", "first_gpu_build",
           "launch_recorders", "late_watchers"]


@dataclass(frozen=True)
class Extension:
    """One registration: ``target`` (``"module:attribute"``) serves ``library`` (a top-level module name)."""

    library: str
    target: str

    def load(self) -> Any:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


_recorders: list[Extension] = []
_watchers: list[Extension] = []
_gpu_hooks: list[Extension] = []
_lock = threading.Lock()
_gpu_hooks_run = False


def _add(table: list[Extension], library: str, target: str) -> None:
    if ":" not in target:
        raise ValueError(f"buildops extension {target!r} for {library}: expected 'module:attribute'")
    entry = Extension(library, target)
    if entry not in table:
        table.append(entry)


def add_launch_recorder(library: str, target: str) -> None:
    """Register how listing by replay records ``library``'s kernel launches.

    Contract for the target: a context manager factory ``recorder(op: str)`` that yields a list; while it is
    entered, launches of ``library``'s kernels on this thread (this context) are appended to it as
    :class:`~buildops.Build` objects instead of compiling or running, and other threads launch as usual.
    """
    _add(_recorders, library, target)


def add_late_watcher(library: str, target: str) -> None:
    """Register how to watch ``library`` for kernels compiled on first use.

    Contract for the target: a function of no arguments that installs a compile hook (idempotently) which reports
    each compile outside buildops' workers with :func:`buildops._core.late.record`. It is called at the end of
    every outermost pass, only if ``library`` is imported by then.
    """
    _add(_watchers, library, target)


def add_first_gpu_build_hook(target: str) -> None:
    """Register a function of no arguments, called once per process when the builder first receives a GPU build
    (the CUDA graph capture guard is installed so)."""
    _add(_gpu_hooks, "torch", target)


def launch_recorders() -> list[Callable[..., Any]]:
    """The recorders of the libraries that are installed here, loaded."""
    return [entry.load() for entry in list(_recorders) if importlib.util.find_spec(entry.library) is not None]


def late_watchers() -> list[Callable[[], None]]:
    """The late-compile watchers of the libraries imported now, loaded."""
    return [entry.load() for entry in list(_watchers) if entry.library in sys.modules]


def first_gpu_build() -> None:
    """Run the first-GPU-build hooks, once per process (a failure raises to the submitter, and they run again)."""
    global _gpu_hooks_run
    if _gpu_hooks_run:
        return
    with _lock:
        if not _gpu_hooks_run:
            for entry in list(_gpu_hooks):
                entry.load()()
            _gpu_hooks_run = True
