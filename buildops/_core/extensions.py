"""What backends provide to the core: one :class:`Backend` registration per library, so that the core and the
public layer (startup, manifests, doctor, reports) import no backend and name no library.

Each part of a registration is ``"module:attribute"``, imported only when the core first needs it, and only where
the library it serves is in use: registering imports nothing. ``buildops.backends`` registers the backends that
ship with buildops; another package registers its own the same way (docs/backends/writing-a-backend.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .state import core

__all__ = ["Backend", "add_first_gpu_build_hook", "backend", "backends", "first_gpu_build", "launch_recorders",
           "late_watchers", "load", "register"]


@dataclass(frozen=True)
class Backend:
    """One library's backend. ``name`` is what its builds carry as ``Build.library`` (reports count by it,
    manifests and ``buildops doctor`` name it); ``library`` is the top-level module it serves. Every other field is
    ``"module:attribute"`` or None (the backend has no such part).

    Contract for each part:
      * ``recorder``: a context manager factory ``recorder(op: str)`` that yields a list; while it is entered,
        launches of the library's kernels on this thread (this context) are appended to it as
        :class:`~buildops.Build` objects instead of compiling or running, and other threads launch as usual.
        Used by listing by replay, where the library is installed. Calling ``buildops.backends.recorded(build)``
        as each one is appended lets a pass start it before the replay's host code ends.
      * ``late_watchers``: functions of no arguments, each installing a compile hook (idempotently) that reports
        each compile outside buildops' workers with :func:`buildops._core.late.record`. Called at the end of every
        outermost pass, where the library is imported by then.
      * ``recipes``: a module with ``entry(build) -> dict | str``, one of the backend's builds as a manifest entry
        (JSON-able, with ``"library": name``), or why it has none; and ``prebuild_build(entry) -> Build | str``,
        the entry's build on this machine, or why this machine refuses it (``buildops prebuild``).
      * ``start_workers``: a function of no arguments that starts the backend's worker pool, or the forkserver its
        workers fork from, ahead of its first build (:func:`buildops.startup.start_build_workers`) and returns at
        once: True if they run or are starting. Called where the library is installed, before the engine imports
        torch: it must not import it.
      * ``forkserver_preload``: a sequence of module names that the forkserver the backend's workers fork from
        imports before it forks any (their code, and torch with it). :func:`buildops.startup.start_build_workers`
        adds every installed backend's to the forkserver's list before it calls any ``start_workers``, so that
        whichever starts the forkserver starts it with all of them. Their import must raise nothing but
        ImportError, which the forkserver ignores.
      * ``cache``: a function of no arguments returning the library's kernel cache directory (``buildops
        doctor``); it raises ``LookupError`` saying why where that is not known here.
      * ``describe``: a function of no arguments returning what ``buildops doctor`` shows of the backend beyond
        its cache: ``{label: text}``, e.g. ``{"target": "cuda:90 (this GPU's)"}``. It must not raise.
    """

    name: str
    library: str
    recorder: str | None = None
    late_watchers: tuple[str, ...] = ()
    recipes: str | None = None
    start_workers: str | None = None
    forkserver_preload: str | None = None
    cache: str | None = None
    describe: str | None = None

    def __post_init__(self) -> None:
        named = {"recorder": self.recorder, "start_workers": self.start_workers,
                 "forkserver_preload": self.forkserver_preload, "cache": self.cache, "describe": self.describe,
                 **{f"late_watchers[{i}]": t for i, t in enumerate(self.late_watchers)}}
        for part, target in named.items():
            if target is not None and ":" not in target:
                raise ValueError(f"buildops backend {self.name}: {part}={target!r}: expected 'module:attribute'")

    def modules(self) -> set[str]:
        """The modules its parts name."""
        parts = (self.recorder, self.recipes, self.start_workers, self.forkserver_preload, self.cache, self.describe,
                 *self.late_watchers)
        return {target.partition(":")[0] for target in parts if target is not None}

    def installed(self) -> bool:
        return importlib.util.find_spec(self.library) is not None

    def imported(self) -> bool:
        return self.library in sys.modules


def load(target: str) -> Any:
    """The object ``"module:attribute"`` names, its module imported now (a plain module name: the module)."""
    module, _, attribute = target.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def register(registration: Backend) -> None:
    """Register a backend (again: the new registration replaces the one of that name)."""
    with core.registry_lock:
        core.backends[registration.name] = registration


def backends() -> list[Backend]:
    """Every registered backend, in the order registered."""
    with core.registry_lock:
        return list(core.backends.values())


def backend(name: str) -> Backend | None:
    """The backend registered as ``name`` (a build's ``library``), or None."""
    with core.registry_lock:
        return core.backends.get(name)


def launch_recorders() -> list[Callable[..., Any]]:
    """The recorders of the backends whose libraries are installed here, loaded."""
    return [load(b.recorder) for b in backends() if b.recorder is not None and b.installed()]


def late_watchers() -> list[Callable[[], None]]:
    """The late-compile watchers of the backends whose libraries are imported now, loaded."""
    return [load(target) for b in backends() if b.imported() for target in b.late_watchers]


def add_first_gpu_build_hook(target: str) -> None:
    """Register a function of no arguments, called once per process when the builder first receives a GPU build
    (the CUDA graph capture guard is installed so)."""
    if ":" not in target:
        raise ValueError(f"buildops first-GPU-build hook {target!r}: expected 'module:attribute'")
    with core.registry_lock:
        if target not in core.gpu_hooks:
            core.gpu_hooks.append(target)


def first_gpu_build() -> None:
    """Run the first-GPU-build hooks, once per process (a failure raises to the submitter, and they run again)."""
    if core.gpu_hooks_run:
        return
    with core.registry_lock:
        if not core.gpu_hooks_run:
            for target in list(core.gpu_hooks):
                load(target)()
            core.gpu_hooks_run = True
