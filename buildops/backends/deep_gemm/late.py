"""DeepGEMM kernels compiled on first use after a pass, seen as new entries of DeepGEMM's cache.

DeepGEMM has no compile hook, but each compile renames a new ``kernel.<name>.<hash>`` directory into
``<cache>/cache``, which changes that directory. :func:`watch_late_compiles` wraps DeepGEMM's public functions
that may compile (a :class:`~buildops._runtime.patching.Patch` each): a call stats the directory before and after,
and only when it changed lists it; each entry that appeared during the call is a late compile. Limits:

- a reference taken before the watch (``from deep_gemm import fp8_gemm_nt`` at import) calls the original, unwatched;
- a call that overlaps a DeepGEMM build or store install of this process reports nothing: the new entry may be
  the build's, and it becomes part of that build's artifact;
- the directory is shared by the node's processes: an entry another one adds during a call counts as the call's.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..._core.builder_threads import on_builder_thread
from ..._core.late import LateCompile, LateCompileError, caller, record
from ..._runtime.patching import Patch
from . import versions
from .entries import entries_being_made
from .state import deep_gemm_state

__all__ = ["note_built", "note_module", "watch_late_compiles"]


def note_module(module: str) -> None:
    """Watch ``module`` too (the module a DeepGEMM build runs), from the end of the next pass."""
    with deep_gemm_state.watch_lock:
        deep_gemm_state.watched_modules.add(module)


def note_built(op: str, entries: Iterable[str]) -> None:
    """Note that a build of ``op`` made ``entries``, so that a late compile of their kernels names the op."""
    with deep_gemm_state.watch_lock:
        for entry in entries:
            deep_gemm_state.built_by.setdefault(versions.kernel_name(entry), set()).add(op)


def _signature(directory: Path) -> tuple[int, int, int] | None:
    # The link count and size besides the mtime: a rename in the same clock tick as the last change leaves the
    # mtime as it was, but a new subdirectory raises the link count (or the size) on the usual filesystems.
    try:
        stat = os.stat(directory)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_nlink, stat.st_size


def _entries(directory: Path) -> frozenset[str]:
    try:
        return frozenset(name for name in os.listdir(directory) if versions.is_entry(name))
    except OSError:
        return frozenset()


def _baseline(directory: Path, signature: Any) -> None:
    """Bring the directory's listing up to date before a call, if it changed since it was last listed."""
    with deep_gemm_state.watch_lock:
        known = deep_gemm_state.watch_listed.get(directory)
        if known is not None and known[0] == signature:
            return
    listing = _entries(directory)
    with deep_gemm_state.watch_lock:
        deep_gemm_state.watch_listed[directory] = (signature, listing)


def _appeared(directory: Path, signature: Any) -> list[str]:
    """The entries that appeared since the directory was last listed; it is listed as it is now."""
    listing = _entries(directory)
    with deep_gemm_state.watch_lock:
        known = deep_gemm_state.watch_listed.get(directory)
        deep_gemm_state.watch_listed[directory] = (signature, listing)
    return sorted(listing - known[1]) if known is not None else []


def _report(new: list[str]) -> None:
    """Record each new entry; in ``error`` mode, raise the first error once all are recorded."""
    where = caller()
    first: LateCompileError | None = None
    for entry in new:
        kernel = versions.kernel_name(entry)
        with deep_gemm_state.watch_lock:
            ops = tuple(sorted(deep_gemm_state.built_by.get(kernel, ())))
        try:
            record(LateCompile("deep_gemm", kernel, entry, ops, where), ("deep_gemm", entry))
        except LateCompileError as error:
            first = first or error
    if first is not None:
        raise first


def _watched(original: Any) -> Any:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if on_builder_thread():  # a build of the threads executor, not a late compile
            return original(*args, **kwargs)
        directory = versions.entries_dir()
        before, making = _signature(directory), entries_being_made()
        _baseline(directory, before)
        result = original(*args, **kwargs)
        after = _signature(directory)
        if after != before:
            new = _appeared(directory, after)
            # Reported only if no build or install of this process was under way at any time during the call.
            if new and making[0] == 0 and entries_being_made() == making:
                _report(new)
        return result
    return call


def watch_late_compiles() -> None:
    """Wrap the :data:`.versions.ENTRY_POINTS` of each DeepGEMM module imported now (``deep_gemm`` and any a build
    ran), so that a kernel they compile outside buildops' builds after a pass is recorded as a late compile, until
    ``buildops.testing.reset()``."""
    with deep_gemm_state.watch_lock:
        modules = [sys.modules[name] for name in sorted(deep_gemm_state.watched_modules) if name in sys.modules]
        for module in modules:
            for name in versions.ENTRY_POINTS:
                key = (module.__name__, name)
                if key in deep_gemm_state.watch_patches or not callable(getattr(module, name, None)):
                    continue
                patch = Patch(module, name, _watched, "DeepGEMM 2.6 has no hook after a kernel compiles")
                patch.acquire()
                deep_gemm_state.watch_patches[key] = patch
