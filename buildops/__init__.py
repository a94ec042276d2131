"""buildops: build the GPU kernels an inference server needs in parallel, before they are first called.

Decorate ops with :func:`lists_kernels` or :func:`builds_by_running`, run dummy forwards inside
:func:`build_pass` (or :func:`rehearsal`, which does not wait at its end), and the first call per call signature
queues compile-only builds for every swept shape on the process's builder.

The package is layered; each layer imports only those below it: ``_config`` (settings), ``_runtime`` (processes
and the host), ``store`` (the build store shared by a cluster's nodes), ``_core`` (specs, builds, the builder,
passes, ops), ``backends`` (Triton, FlashInfer, DeepGEMM, variant recording), then the public modules ``capture``,
``reporting``, ``startup`` and ``testing``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import backends  # noqa: F401 - registers the backends with the core; imports none of their libraries
from ._config import ConfigError, settings
from ._core import extensions
from ._core.build import Build, BuildRecord, BuildState, BuildTimeoutError, Outcome
from ._core.default import join, shutdown
from ._core.families import OpFamily, model_configured, model_created, register_family, unregister_family
from ._core.late import LateCompile, LateCompileError, late_compiles
from ._core.passes import BuildPass, build_pass, rehearsal
from ._version import __version__
from .reporting import Coverage, ListedNothing, OpReport, Report, report
from .saved_reports import load_report

# A GPU build must not overlap a CUDA graph capture: the guard goes on where the first one is queued.
extensions.add_first_gpu_build_hook("buildops.capture:install_guard")

# Names from modules that import torch, imported on first use: `import buildops` costs no torch import, so that a
# startup can call `buildops.startup.start_build_workers()` first thing and start the workers' own imports beside
# its own.
_FROM_TORCH_MODULES = {
    "GraphCaptureDuringBuild": "capture", "prepare_graph_capture": "capture",
    "Op": "_core.declaring", "lists_kernels": "_core.ops", "builds_by_running": "_core.running",
    "BuildConfig": "_core.specs", "DynamicSpec": "_core.specs", "SpecError": "_core.specs",
    "TensorSpec": "_core.tensor_specs",
}

if TYPE_CHECKING:
    from ._core.declaring import Op
    from ._core.ops import lists_kernels
    from ._core.running import builds_by_running
    from ._core.specs import BuildConfig, DynamicSpec, SpecError
    from ._core.tensor_specs import TensorSpec
    from .capture import GraphCaptureDuringBuild, prepare_graph_capture


def __getattr__(name: str) -> Any:
    module = _FROM_TORCH_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'buildops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Build",
    "BuildConfig",
    "BuildPass",
    "BuildRecord",
    "BuildState",
    "BuildTimeoutError",
    "ConfigError",
    "Coverage",
    "DynamicSpec",
    "GraphCaptureDuringBuild",
    "LateCompile",
    "LateCompileError",
    "ListedNothing",
    "Op",
    "OpFamily",
    "OpReport",
    "Outcome",
    "Report",
    "SpecError",
    "TensorSpec",
    "__version__",
    "build_pass",
    "builds_by_running",
    "join",
    "late_compiles",
    "lists_kernels",
    "load_report",
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
