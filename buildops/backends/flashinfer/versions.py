"""FlashInfer's internals that buildops reads, kept here so that a new FlashInfer changes one place.
Checked against 0.7.4 (pyproject.toml asks for 0.7 or later; the CPU machines build its modules for sm_90 with nvcc,
the GPU host runs them), with apache-tvm-ffi 0.1.15.

* A module's build through ``JitSpec``'s public contract: ``name``, ``lock_path`` (the file lock that
  ``build_and_load`` takes) and ``build()``, which compiles without loading. ``build_and_load`` would load the
  module and ``build_jit_specs`` runs one ninja for many modules without their libraries' paths, so a build calls
  ``build`` itself. ``build``'s ``verbose`` and the library's path ``jit_library_path`` belong to ``JitSpecNvcc``
  (the only kind buildops builds); the base class's ``get_library_path`` names the AOT library instead where one
  is installed.
* The classes whose ``build`` a patch wraps: those of ``flashinfer.jit.core`` that are ``JitSpec`` or derive from
  it (0.7.4: ``JitSpecNvcc``; ``JitSpecCuteDsl`` lives in ``flashinfer.jit.cute_dsl_core``).
* Which modules a store can share: a ``JitSpecNvcc`` whose ``embedded_cubin_factory`` is None (one with a factory
  embeds cubins found elsewhere into its library).
* The build description: ``flashinfer.jit.cpp_ext.generate_ninja_build_for_op`` with the spec's fields, as
  ``JitSpecNvcc.write_ninja`` calls it; its ``cuda_home = <path>`` line, and its ``cxx_launcher`` and
  ``nvcc_launcher`` lines (``FLASHINFER_CXX_LAUNCHER``, ``FLASHINFER_NVCC_LAUNCHER``: ccache and the like).
  ``get_cuda_path`` finds CUDA as the build does; nvcc is ``FLASHINFER_NVCC`` or ``$cuda_home/bin/nvcc``, the host
  compiler ``CXX`` (``c++``) and ``CC``.
* Where its files are: ``flashinfer.jit.env``'s ``FLASHINFER_JIT_DIR`` (modules, read at each use, since tests
  point it elsewhere), ``FLASHINFER_GEN_SRC_DIR`` and ``FLASHINFER_WORKSPACE_DIR``, all under the workspace that
  ``FLASHINFER_WORKSPACE_BASE`` decides at import.
* Its version: ``flashinfer.version``'s ``__version__`` and ``__git_commit__`` (``"unknown"`` in a wheel built
  without git), and TVM FFI's ``__version__`` (its headers come with it).
* :data:`PLAN_LOOKUPS`: the module getters an attention wrapper's ``plan()`` calls by their module's name
  (``flashinfer.decode`` imports ``get_batch_prefill_module`` from ``flashinfer.prefill``).

Imports FlashInfer only inside its functions: FlashInfer reads its build settings when it is imported, and
importing this backend must not fix them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["NINJA_LAUNCHER_LINES", "PLAN_LOOKUPS", "build", "build_description", "cuda_home", "cuda_home_line",
           "host_compilers", "install_roots", "jit_dir", "library_path", "lock_path", "nvcc", "nvcc_spec_class",
           "shareable", "sources", "spec_classes", "versions"]

PLAN_LOOKUPS = (
    "flashinfer.decode.get_batch_decode_module",
    "flashinfer.decode.get_batch_prefill_module",
    "flashinfer.prefill.get_batch_prefill_module",
)
"""The module getters a FlashInfer attention wrapper's ``plan()`` calls: pass them to
:func:`buildops.backends.variants.variants` to turn a plan into the builds of the modules it needs."""

#: the starts of the build description's lines that name compiler launchers, which do not change what compiles
NINJA_LAUNCHER_LINES = ("cxx_launcher =", "nvcc_launcher =")


def library_path(spec: Any) -> Path:
    """Where ``spec``'s build leaves the module's library in the JIT dir (``<name>/<name>.so``)."""
    return Path(spec.jit_library_path)


def sources(spec: Any) -> list[Path]:
    """The source files ``spec``'s module compiles."""
    return [Path(source) for source in spec.sources]


def lock_path(spec: Any) -> Path:
    """The file lock FlashInfer's ``build_and_load`` takes for ``spec``'s module."""
    return Path(spec.lock_path)


def build(spec: Any) -> None:
    """Compile ``spec``'s module, quietly, without loading it (the caller holds :func:`lock_path`)."""
    spec.build(verbose=False)


def spec_classes() -> list[type]:
    """FlashInfer's ``JitSpec`` classes whose ``build`` compiles a module."""
    from flashinfer.jit import core

    return [c for c in vars(core).values() if isinstance(c, type) and issubclass(c, core.JitSpec)]


def nvcc_spec_class() -> type:
    """``JitSpecNvcc``: a module compiled by ninja and nvcc into one library."""
    from flashinfer.jit.core import JitSpecNvcc

    return JitSpecNvcc


def shareable(spec: Any) -> bool:
    """Whether ``spec``'s module can be shared: an nvcc module whose library is all it needs (one that embeds
    cubins found elsewhere is not)."""
    return isinstance(spec, nvcc_spec_class()) and spec.embedded_cubin_factory is None


def build_description(spec: Any) -> str:
    """The ninja file FlashInfer writes for ``spec``'s module now."""
    from flashinfer.jit.cpp_ext import generate_ninja_build_for_op

    return generate_ninja_build_for_op(
        name=spec.name, sources=spec.sources, extra_cflags=spec.extra_cflags,
        extra_cuda_cflags=spec.extra_cuda_cflags, extra_ldflags=spec.extra_ldflags,
        extra_include_dirs=spec.extra_include_dirs, needs_device_linking=spec.needs_device_linking,
        extra_cuda_cflags_by_source=spec.extra_cuda_cflags_by_source)


def cuda_home() -> str:
    """The CUDA install FlashInfer's build uses."""
    from flashinfer.jit.cpp_ext import get_cuda_path

    return get_cuda_path()


def cuda_home_line(path: str) -> str:
    """The build description's line that names the CUDA install ``path``."""
    return f"cuda_home = {path}\n"


def nvcc(cuda: str) -> str:
    """The nvcc command FlashInfer's build runs, given the CUDA install ``cuda``."""
    return os.environ.get("FLASHINFER_NVCC", "$cuda_home/bin/nvcc").replace("$cuda_home", cuda)


def host_compilers() -> list[str]:
    """The host compiler commands FlashInfer's build runs: ``CXX``, and ``CC`` where set."""
    return [os.environ.get("CXX", "c++"), *([os.environ["CC"]] if os.environ.get("CC") else [])]


def jit_dir() -> Path:
    """Where FlashInfer compiles its JIT modules (``FLASHINFER_WORKSPACE_BASE`` decides)."""
    from flashinfer.jit import env

    return Path(env.FLASHINFER_JIT_DIR)


def install_roots() -> dict[str, Path]:
    """FlashInfer's and TVM FFI's directories that its build descriptions name, by a name for each."""
    import flashinfer
    import tvm_ffi
    from flashinfer.jit import env

    return {
        "<flashinfer-jit>": Path(env.FLASHINFER_JIT_DIR),
        "<flashinfer-generated>": Path(env.FLASHINFER_GEN_SRC_DIR),
        "<flashinfer-workspace>": Path(env.FLASHINFER_WORKSPACE_DIR),
        "<flashinfer>": Path(flashinfer.__file__).parent,
        "<tvm_ffi>": Path(tvm_ffi.__file__).parent,
    }


def versions() -> str:
    """FlashInfer's version and git commit, and TVM FFI's version."""
    from flashinfer import version as flashinfer_version
    from tvm_ffi import __version__ as tvm_ffi_version

    return f"flashinfer {flashinfer_version.__version__} {flashinfer_version.__git_commit__}|tvm_ffi {tvm_ffi_version}"
