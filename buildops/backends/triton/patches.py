"""Patches of Triton held while buildops builds, for two steps of Triton's that are not thread-safe.

Both are held by :func:`building` around every build's compile and load, so they are installed exactly while
builder threads may run those steps beside each other or beside the engine's threads, and never otherwise
(docs/decisions/0006-one-kernel-parse-at-a-time.md, docs/decisions/0007-triton-helper-modules-loaded-one-at-a-time.md).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

from triton.runtime.jit import JITFunction

from ..._runtime.forking import free_in_child
from ..._runtime.patching import Patch
from .state import triton_state

__all__ = ["building"]

_parse_lock = free_in_child(threading.RLock())
_module_load_lock = free_in_child(threading.Lock())


def _one_parse_at_a_time(original: Any) -> Any:
    def parse(self: JITFunction) -> Any:
        with _parse_lock:
            return original(self)
    return parse


def _one_load_at_a_time(original: Any) -> Any:
    def load_module_from_path(name: str, path: str) -> Any:
        with _module_load_lock:
            sys.modules.pop(name, None)  # one loaded outside a build (a first launch) must never be refilled
            module = original(name, path)
            if sys.modules.get(name) is module:
                del sys.modules[name]
        return module
    return load_module_from_path


def _patches() -> list[Patch]:
    found = []
    if hasattr(JITFunction, "parse"):
        found.append(Patch(JITFunction, "parse", _one_parse_at_a_time,
                           "Python <= 3.12 shares ast.parse's recursion-depth count across threads "
                           "(python/cpython#106905): parses at once fail with 'AST constructor recursion depth "
                           "mismatch'. Triton 3.6-3.7 parse a kernel's source at every compile "
                           "(docs/decisions/0006-one-kernel-parse-at-a-time.md)."))
    try:
        from triton.runtime import build as triton_build
    except ImportError:  # another Triton: its loads stay as they are
        return found
    if hasattr(triton_build, "_load_module_from_path"):
        found.append(Patch(triton_build, "_load_module_from_path", _one_load_at_a_time,
                           "Triton <= 3.6 loads every launcher under one module name; CPython refills the module "
                           "it finds in sys.modules, so a concurrent load can hand one signature another's launch "
                           "(docs/decisions/0007-triton-helper-modules-loaded-one-at-a-time.md)."))
    return found


@contextlib.contextmanager
def building() -> Iterator[None]:
    """Hold both patches for the block (a build's compile and load)."""
    with triton_state.build_patches_lock:
        held = triton_state.build_patches
        if held is None:
            held = triton_state.build_patches = _patches()
    with contextlib.ExitStack() as stack:
        for patch in held:
            stack.enter_context(patch.applied())
        yield
