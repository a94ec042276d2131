"""The backends that ship with buildops, registered with the core by name (registering imports no library), and
what a backend of another package uses to register itself (docs/backends/writing-a-backend.md).

Each backend is a module (or package) of its own, imported only when its library is used: ``triton``,
``flashinfer``, ``deep_gemm`` and ``variants`` (variant recording: a plan's lookups recorded as builds, which
need no registration: they run the library's own code).
"""

from __future__ import annotations

from .._core.builder_threads import on_builder_thread
from .._core.early_starts import recorded
from .._core.extensions import Backend, register
from .._core.late import LateCompile, caller
from .._core.late import record as record_late_compile

__all__ = ["Backend", "LateCompile", "caller", "on_builder_thread", "record_late_compile", "recorded", "register"]

register(Backend(
    "triton", "triton",
    recorder="buildops.backends.triton.record:recording",
    late_watchers=("buildops.backends.triton.late:watch_late_compiles",
                   "buildops.backends.triton.record:serve_after_passes"),  # and late tunings
    recipes="buildops.backends.triton.recipes",
    start_workers="buildops.backends.triton.startup:start_workers",
    cache="buildops.backends.triton.doctor:cache",
    describe="buildops.backends.triton.doctor:describe",
))
register(Backend(
    "flashinfer", "flashinfer",
    late_watchers=("buildops.backends.flashinfer.builds:watch_late_compiles",),
    cache="buildops.backends.flashinfer.builds:jit_directory",
))
register(Backend(
    "deep_gemm", "deep_gemm",
    late_watchers=("buildops.backends.deep_gemm.late:watch_late_compiles",),
    recipes="buildops.backends.deep_gemm.recipes",
    start_workers="buildops.backends.deep_gemm.startup:start_workers",
    forkserver_preload="buildops.backends.deep_gemm.startup:FORKSERVER_PRELOAD",
    cache="buildops.backends.deep_gemm.versions:cache_root",
))
