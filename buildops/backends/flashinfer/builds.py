"""FlashInfer module builds (:func:`module_builds`), their runs, and the watch for modules compiled late."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..._config import settings
from ..._core.build import Build, Outcome
from ..._core.builder_threads import on_builder_thread
from ..._core.late import LateCompile, caller, record
from . import build_patch, versions
from .state import flashinfer_state
from .store import FlashInferModule
from .versions import PLAN_LOOKUPS

__all__ = ["PLAN_LOOKUPS", "jit_directory", "module_builds", "watch_late_compiles"]

_GIB = 1 << 30
# Memory to leave each build running at once: one nvcc of an attention module can take several GiB.
_MEMORY_PER_BUILD = 4 * _GIB
# The host's memory where the system does not say.
_MEMORY_IF_UNKNOWN = 16 * _GIB


def _concurrent_builds() -> int:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = _MEMORY_IF_UNKNOWN
    return max(1, min(settings.threads, memory // _MEMORY_PER_BUILD))


def _build_slots() -> threading.BoundedSemaphore:
    with flashinfer_state.build_slots_lock:
        slots = flashinfer_state.build_slots
        if slots is None:
            slots = flashinfer_state.build_slots = threading.BoundedSemaphore(_concurrent_builds())
        return slots


class _ModuleBuild:
    """A build's run: ``JitSpec.build`` under FlashInfer's lock for the module; its outcome holds the library's
    path, and ``cached`` True when the library was there before and the build left it as it was: built earlier, or
    installed from the build store."""

    def __init__(self, spec) -> None:
        self.spec = spec

    def __call__(self) -> Outcome:
        library = versions.library_path(self.spec)
        with _build_slots(), FileLock(versions.lock_path(self.spec), thread_local=False):
            before = _mtime(library)
            versions.build(self.spec)
            return Outcome(library, cached=before is not None and _mtime(library) == before)


def module_builds(op: str, specs: Iterable) -> list[Build]:
    """One build per FlashInfer ``JitSpec``; an nvcc module's build is shared through the build store
    (``BUILDOPS_STORE``, :mod:`.store`).

    Args:
        op: the op the builds are reported under.
        specs: FlashInfer ``JitSpec`` objects, e.g. ``flashinfer.jit.activation.gen_act_and_mul_module("silu")``.
    """
    return [Build(op, ("flashinfer", spec.name, str(versions.library_path(spec))), _ModuleBuild(spec),
                  label=f"flashinfer module {spec.name}", library="flashinfer",
                  artifact=FlashInferModule(spec) if versions.shareable(spec) else None) for spec in specs]


# -- late compiles --------------------------------------------------------------------------------------------

def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _reporting_build(original: Any) -> Any:
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _mtime(versions.library_path(self))
        result = original(self, *args, **kwargs)
        if not on_builder_thread() and _mtime(versions.library_path(self)) != before:
            record(LateCompile("flashinfer", self.name, "JIT module", (), caller()), ("flashinfer", self.name))
        return result
    return build


def jit_directory() -> Path:
    """Where FlashInfer compiles its JIT modules (``FLASHINFER_WORKSPACE_BASE`` decides): ``buildops doctor``."""
    return versions.jit_dir()


def watch_late_compiles() -> None:
    """Wrap FlashInfer's ``JitSpec.build`` (which its ``build_and_load`` calls) so that a module compiled outside
    the builder's threads after a pass is recorded as a late compile, until ``buildops.testing.reset()``. A build
    that finds the module up to date leaves the library's file untouched and is not late."""
    build_patch.hold("late compiles", versions.spec_classes(), _reporting_build,
                     "FlashInfer 0.7 has no hook after a JIT module compiles")

