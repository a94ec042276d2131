"""The Triton backend: compile-only builds with each launch's exact specialization, listing by replay, worker
processes, autotuning in the build, and late-compile detection.

Its modules: ``driver`` (the target, a driver for machines without a GPU), ``stand_ins`` (what a build records of
a tensor), ``record`` (launches recorded as builds), ``pending`` (what a recorded launch returns: a kernel resolved
after the pass), ``interpret`` (Triton's interpreter: launches listed, nothing to compile), ``build`` (a build's
compile and load), ``autotune`` (autotuning in the build), ``tunings`` (a tuner's choices: kept, nearest),
``serving`` (no tuning on a serving thread after a pass), ``patches`` (Triton steps serialised while building),
``late`` (late compiles), ``worker`` (the worker processes' pool, and what runs in them), ``preload`` and ``warm``
(what their forkserver imports), ``startup`` (the pool started early), ``doctor``, and ``state`` (the backend's
process-wide state, and what a reset and a fork make it forget). Importing this package imports neither Triton nor
torch: the forkserver imports its ``preload`` module before torch. The public names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .build import hash_triton_install
    from .driver import CompileOnlyDriver, target
    from .record import recording, triton_builds
    from .stand_ins import PointerArg

_PUBLIC = {
    "CompileOnlyDriver": "driver", "PointerArg": "stand_ins", "hash_triton_install": "build",
    "recording": "record", "target": "driver", "triton_builds": "record",
}

__all__ = ["CompileOnlyDriver", "PointerArg", "hash_triton_install", "recording", "target", "triton_builds"]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
