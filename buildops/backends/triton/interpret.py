"""Triton's interpreter (``TRITON_INTERPRET=1``, read when ``@triton.jit`` decorates): kernels are
``InterpretedFunction`` objects that run in Python on the CPU and compile nothing.

A replay records their launches as in compiled mode: the same op, the same specialization (from the binder of a
``JITFunction`` made over the same Python function, the kernel's *twin*), so the same label. The build that results
has nothing to compile: its run returns at once and says so (``skipped``, the ``Build`` contract), and the report
counts it apart from the kernels prebuilt.

Nothing here imports ``triton.runtime.interpreter``: an interpreted kernel exists only once Triton has imported it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from triton.runtime.jit import JITFunction

from ..._core.build import Outcome
from ..._runtime.forking import free_in_child
from ..._runtime.patching import Patch
from .state import triton_state
from .versions import INTERPRETER_MODULE

__all__ = ["NOTHING_TO_COMPILE", "InterpretedRun", "innermost", "interpreted", "run_patch", "twin"]

#: what an interpreted kernel's build says it did (its ``skipped`` reason)
NOTHING_TO_COMPILE = "nothing to compile (Triton interpreter)"


def interpreted(kernel: Any) -> bool:
    """Whether ``kernel`` (the innermost one, under any ``@triton.autotune``/``@triton.heuristics``) runs in
    Triton's interpreter."""
    module = sys.modules.get(INTERPRETER_MODULE)
    return module is not None and isinstance(innermost(kernel), module.InterpretedFunction)


def innermost(kernel: Any) -> Any:
    """The ``JITFunction`` or ``InterpretedFunction`` under a kernel's wrappers."""
    module = sys.modules.get(INTERPRETER_MODULE)
    leaf: tuple[type, ...] = (JITFunction,) if module is None else (JITFunction, module.InterpretedFunction)
    while not isinstance(kernel, leaf):
        kernel = kernel.fn
    return kernel


_twins_lock = free_in_child(threading.Lock())


def twin(kernel: Any) -> JITFunction:
    """The ``JITFunction`` over an interpreted kernel's own Python function and options (made once, kept on the
    kernel): its binder specializes a launch as the compiled kernel's would, and its ``cache_key`` hashes the same
    source. It is never compiled or launched."""
    made = getattr(kernel, "_buildops_twin", None)
    if made is None:
        with _twins_lock:
            made = getattr(kernel, "_buildops_twin", None)
            if made is None:
                made = JITFunction(kernel.fn, **kernel.kwargs)
                kernel._buildops_twin = made
    return made


class InterpretedRun:
    """The run of an interpreted kernel's build: there is nothing to compile, and it says so."""

    def __call__(self) -> Outcome:
        return Outcome(NOTHING_TO_COMPILE, skipped=NOTHING_TO_COMPILE)


def run_patch(make: Any) -> Patch | None:
    """The patch of ``InterpretedFunction.run`` that records launches (``make`` builds the replacement, as for
    ``JITFunction.run``), or None while Triton's interpreter is not imported (no kernel is interpreted)."""
    module = sys.modules.get(INTERPRETER_MODULE)
    if module is None:
        return None
    with triton_state.interpreter_patch_lock:
        patch = triton_state.interpreter_patch
        if patch is None:
            patch = triton_state.interpreter_patch = Patch(
                module.InterpretedFunction, "run", make,
                "Triton 3.6-3.7's interpreter runs a launch in Python on the tensors it is given, which on a "
                "replay's stand-ins fails: launches are recorded where they would run")
    return patch
