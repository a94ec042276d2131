"""buildops: build the GPU kernels an inference server needs in parallel, before they are first called.

Decorate ops with :func:`lists_kernels` or :func:`builds_by_running`, run dummy forwards inside
:func:`build_pass` (or :func:`rehearsal`, which does not wait at its end), and the first call per call signature
queues compile-only builds for every swept shape on the process's builder. See ``docs/`` for the design.
"""

from ._builder import Build, BuildState, join, shutdown
from ._capture import GraphCaptureDuringBuild, prepare_graph_capture
from ._config import ConfigError, settings
from ._families import OpFamily, model_created, register_family, unregister_family
from ._late import LateCompile, LateCompileError, late_compiles
from ._ops import builds_by_running, lists_kernels
from ._passes import build_pass, rehearsal
from ._specs import BuildConfig, DynamicSpec, SpecError, TensorSpec
from .report import report

__all__ = [
    "Build",
    "BuildConfig",
    "BuildState",
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
    "model_created",
    "prepare_graph_capture",
    "register_family",
    "rehearsal",
    "report",
    "settings",
    "shutdown",
    "unregister_family",
]
