"""buildops: build the GPU kernels an inference server needs in parallel, before they are first called.

Decorate ops with :func:`lists_kernels` or :func:`builds_by_running`, run dummy forwards inside
:func:`build_pass` (or :func:`rehearsal`, which does not wait at its end), and the first call per call signature
queues compile-only builds for every swept shape on the process's builder. See ``docs/`` for the design.
"""

from typing import TYPE_CHECKING

from ._builder import Build, BuildState, BuildTimeoutError, join, shutdown
from ._config import ConfigError, settings
from ._families import OpFamily, model_configured, model_created, register_family, unregister_family
from ._late import LateCompile, LateCompileError, late_compiles
from ._passes import build_pass, rehearsal
from .report import report

# Names from modules that import torch, imported on first use: `import buildops` costs no torch import, so that a
# startup can call `buildops.startup.start_build_workers()` first thing and start the workers' own imports beside
# its own (see docs/design.md, "Starting early").
_FROM_TORCH_MODULES = {
    "GraphCaptureDuringBuild": "_capture", "prepare_graph_capture": "_capture",
    "builds_by_running": "_ops", "lists_kernels": "_ops",
    "BuildConfig": "_specs", "DynamicSpec": "_specs", "SpecError": "_specs", "TensorSpec": "_specs",
}

if TYPE_CHECKING:
    from ._capture import GraphCaptureDuringBuild, prepare_graph_capture
    from ._ops import builds_by_running, lists_kernels
    from ._specs import BuildConfig, DynamicSpec, SpecError, TensorSpec


def __getattr__(name: str):
    module = _FROM_TORCH_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'buildops' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Build",
    "BuildConfig",
    "BuildState",
    "BuildTimeoutError",
    "ConfigError",
    "DynamicSpec",
    "GraphCaptureDuringBuild",
    "LateCompile",
    "LateCompileError",
    "OpFamily",
    "SpecError",
    "TensorSpec",
    "build_pass",
    "builds_by_running",
    "join",
    "late_compiles",
    "lists_kernels",
    "model_configured",
    "model_created",
    "prepare_graph_capture",
    "register_family",
    "rehearsal",
    "report",
    "settings",
    "shutdown",
    "unregister_family",
]
