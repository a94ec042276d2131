"""Triton kernels compiled on first use after a pass, seen through Triton's ``jit_post_compile_hook``."""

from __future__ import annotations

from typing import Any

from triton import knobs

from ..._core.builder_threads import on_builder_thread
from ..._core.late import LateCompile, caller, record
from .labels import compiled_label
from .state import triton_state

__all__ = ["listed_by", "note_listed", "watch_late_compiles"]


def note_listed(kernel: str, op: str) -> None:
    """Note that ``op`` listed builds of ``kernel``, so that a late compile of it names the op (forgotten at
    ``buildops.testing.reset``)."""
    with triton_state.listed_lock:
        triton_state.listed.setdefault(kernel, set()).add(op)


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
    with triton_state.listed_lock:
        return tuple(sorted(triton_state.listed.get(kernel, ())))


def watch_late_compiles() -> None:
    """Install buildops' ``jit_post_compile_hook`` (keeping any hook already set, which it calls first)."""
    current = knobs.runtime.jit_post_compile_hook
    if not isinstance(current, _LateCompileHook):
        knobs.runtime.jit_post_compile_hook = _LateCompileHook(current)
