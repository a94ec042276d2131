"""Triton kernels compiled on first use after a pass, seen through Triton's ``jit_post_compile_hook``."""

from __future__ import annotations

import threading
from typing import Any

from triton import knobs

from ..._core.builder_threads import on_builder_thread
from ..._core.late import LateCompile, caller, record
from ..._runtime.forking import free_in_child
from ..._runtime.hooks import on_reset
from .labels import compiled_label

__all__ = ["forget_listed", "listed_by", "note_listed", "watch_late_compiles"]

_listed: dict[str, set[str]] = {}  # kernel -> the ops that listed builds of it
_listed_lock = free_in_child(threading.Lock())


def note_listed(kernel: str, op: str) -> None:
    """Note that ``op`` listed builds of ``kernel``, so that a late compile of it names the op."""
    with _listed_lock:
        _listed.setdefault(kernel, set()).add(op)


@on_reset.add
def forget_listed() -> None:
    """Forget which ops listed which kernels (``buildops.testing.reset``)."""
    with _listed_lock:
        _listed.clear()


class _LateCompileHook:
    """buildops' ``jit_post_compile_hook``: calls the hook it replaced, then records a compile made outside the
    builder's threads as late."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, **kwargs: Any) -> Any:
        result = self.previous(**kwargs) if self.previous is not None else None
        if on_builder_thread():  # a build; a recording compiles nothing, so it never gets here
            return result
        fn, compiled = kwargs["fn"], kwargs.get("compile") or {}
        name = f"{fn.module}.{fn.name}"
        jit = getattr(fn, "jit_function", None)
        variant = compiled_label(fn.name.rpartition(".")[2], getattr(jit, "arg_names", ()), compiled.get("signature"),
                                 compiled.get("constants"), {"num_warps": compiled.get("num_warps"),
                                                             "num_stages": compiled.get("num_stages")})
        ops = listed_by(name)
        record(LateCompile("triton", name, variant, ops, caller()), (name, kwargs.get("key")))
        return result


def listed_by(kernel: str) -> tuple[str, ...]:
    """The ops that listed builds of ``kernel``, by name."""
    with _listed_lock:
        return tuple(sorted(_listed.get(kernel, ())))


def watch_late_compiles() -> None:
    """Install buildops' ``jit_post_compile_hook`` (keeping any hook already set, which it calls first)."""
    current = knobs.runtime.jit_post_compile_hook
    if not isinstance(current, _LateCompileHook):
        knobs.runtime.jit_post_compile_hook = _LateCompileHook(current)
