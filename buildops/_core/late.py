"""Late compiles: kernels compiled on first use after a build pass, outside buildops' workers; and late tunings:
autotunings a serving call needed at a key no build tuned.

Each one is a gap in what the passes covered. Library backends report them with :func:`record` from their own
compile hooks (Triton: ``knobs.runtime.jit_post_compile_hook``); what happens then follows
``BUILDOPS_LATE_COMPILE``: ``warn`` logs each distinct kernel variant once, ``error`` raises
:class:`LateCompileError` into the call that compiled, ``ignore`` only records.
Nothing is recorded until the first outermost pass has ended: before that, compiling on first use is normal.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Hashable
from dataclasses import dataclass

from .._config import read_or_default, settings
from . import extensions
from .state import core

__all__ = ["LateCompile", "LateCompileError", "late_compiles"]

logger = logging.getLogger("buildops")


class LateCompileError(RuntimeError):
    """A kernel compiled on first use after a build pass, with ``BUILDOPS_LATE_COMPILE=error``."""

    def __init__(self, late: LateCompile) -> None:
        super().__init__(f"{late.describe()}; list it in a build pass (or set BUILDOPS_LATE_COMPILE=warn)")
        self.late = late


@dataclass(frozen=True)
class LateCompile:
    """One kernel compiled on first use after a pass, or one autotuning a serving call needed (``kind``
    ``"tuning"``: a key no build tuned): which library and kernel, which variant, the ops that listed builds of that
    kernel (if any), and where in the user's code it came from."""

    library: str               # "triton", ...
    kernel: str                # module.qualname of the kernel
    variant: str               # the library's description of the specialization that compiled, or of the tuning
    ops: tuple[str, ...]       # ops that listed builds of this kernel, if any
    where: str                 # the first caller frame outside the libraries and buildops
    kind: str = "compile"      # "compile", or "tuning"

    def describe(self) -> str:
        ops = f" (listed by {', '.join(self.ops)})" if self.ops else " (no op listed this kernel)"
        return f"late {self.kind} of {self.library} kernel {self.kernel}{ops} at {self.where}: {self.variant}"


def record(late: LateCompile, key: Hashable) -> None:
    """Report a first-use compile (a backend's compile hook calls this); raises in ``error`` mode."""
    if not core.late_armed:
        return
    mode = read_or_default(type(settings).late_compile)  # in a serving call: a bad value must not raise there
    with core.late_lock:
        first = key not in core.late_seen
        core.late_seen.add(key)
        core.late_records.append(late)
    if mode == "error":
        raise LateCompileError(late)
    if mode == "warn" and first:
        logger.warning("buildops: %s", late.describe())


def arm() -> None:
    """Called when an outermost pass ends: from now on, first-use compiles are late. Installs the watchers of the
    libraries in use (each backend's ``late_watchers``); a library not imported yet is not watched."""
    core.late_armed = True
    for install in extensions.late_watchers():
        install()


def armed() -> bool:
    """Whether an outermost pass has ended (since the last reset): first-use compiles are late from then on."""
    return core.late_armed


def late_compiles() -> list[LateCompile]:
    """Every late compile recorded so far, in order."""
    with core.late_lock:
        return list(core.late_records)


def _library_paths() -> tuple[str, ...]:
    """Where the code a late compile's stack passes through before the user's lives: buildops, torch, the stdlib
    modules that wrap calls, and each backend's library and own modules (a backend of another package)."""
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # buildops itself
    names = {"torch", "contextlib", "functools", "threading"}
    for backend in extensions.backends():
        names |= {backend.library, *backend.modules()}
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            paths.append(os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path)
    return tuple(paths)


def caller() -> str:
    """The innermost frame outside the libraries, their backends and buildops: where a late compile came from."""
    skipped = _library_paths()
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not frame.filename.startswith(skipped):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"
