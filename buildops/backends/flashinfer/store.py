"""A FlashInfer JIT module's library as an :class:`~buildops._core.build.Artifact`, shared through the build store.

FlashInfer leaves a JIT module's freshness to ninja, whose ``.ninja_log`` and ``.ninja_deps`` hold this node's
absolute paths and mtimes: a module directory copied to another node is compiled again there. So the store holds
the module's library (``<name>.so``) alone, and a node that has it tells FlashInfer it is built: from the first
install (or the first build found installed) until ``buildops.testing.reset()``, ``JitSpec.build`` is wrapped so
that, for a module whose library is the one placed under the module's identity now, it returns without running
ninja. Anything else (another identity, a library changed since, no marker) goes to FlashInfer's build as before.

**Identity.** A sha256 of the build description FlashInfer gives ninja (compilers, every flag, the target archs,
the ``FLASHINFER_EXTRA_*`` settings: what ninja's own command hash covers), with its install paths (FlashInfer's
and TVM FFI's packages, the workspace, Python's headers, ``CUDA_HOME``) replaced by names and compiler launchers
(ccache, sccache) left out; the content of each source; FlashInfer's and TVM FFI's versions (their headers come
with them); ``nvcc --version`` and the host compiler's; Python's ABI and the machine. Other absolute paths in
flags (a user's ``-I``/``-L``) stay as written: nodes that differ there do not share.

**Markers.** ``<FLASHINFER_JIT_DIR>/buildops-shared/<identity>`` holds the sha256 of the library an install placed
or found, or a build here left. The library names its sources' paths on the node that built it, in error messages
only (``__FILE__``).

**Concurrency.** An install takes FlashInfer's lock for the module (``JitSpec.lock_path``) and places the library
only where none is, through a file renamed into place: a reader never sees half a library, and a library another
process built is never replaced. Markers are written the same way.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..._runtime.files import write_atomically
from ..._runtime.toolchain import tool_version
from . import build_patch

__all__ = ["FlashInferModule", "shareable"]

MARKERS = "buildops-shared"  # a directory of FlashInfer's JIT dir: the libraries placed or built, by identity
_LAUNCHERS = ("cxx_launcher =", "nvcc_launcher =")  # ccache and the like: they do not change what compiles


def shareable(spec: Any) -> bool:
    """Whether ``spec``'s module can be shared: an nvcc module whose library is all it needs (one that embeds
    cubins found elsewhere is not)."""
    from flashinfer.jit.core import JitSpecNvcc

    return isinstance(spec, JitSpecNvcc) and spec.embedded_cubin_factory is None


# -- identity ----------------------------------------------------------------------------------------------------

def _compilers() -> str:
    """The versions of the compilers FlashInfer's build runs: nvcc and the host's (``CXX``, ``CC``)."""
    from flashinfer.jit.cpp_ext import get_cuda_path

    cuda_home = get_cuda_path()
    nvcc = os.environ.get("FLASHINFER_NVCC", "$cuda_home/bin/nvcc").replace("$cuda_home", cuda_home)
    hosts = [os.environ.get("CXX", "c++"), *([os.environ["CC"]] if os.environ.get("CC") else [])]
    return "\n".join(tool_version(command) for command in [nvcc, *hosts])


def _install_paths() -> list[tuple[str, str]]:
    """This node's install paths as they appear in a build description, with the names that replace them, longest
    first (a path inside another is replaced before it)."""
    import flashinfer
    import tvm_ffi
    from flashinfer.jit import env

    roots = {
        "<flashinfer-jit>": env.FLASHINFER_JIT_DIR,
        "<flashinfer-generated>": env.FLASHINFER_GEN_SRC_DIR,
        "<flashinfer-workspace>": env.FLASHINFER_WORKSPACE_DIR,
        "<flashinfer>": Path(flashinfer.__file__).parent,
        "<tvm_ffi>": Path(tvm_ffi.__file__).parent,
        "<python-include>": Path(sysconfig.get_path("include")),
    }
    pairs = {(str(path), name) for name, root in roots.items() for path in (root, root.resolve())}
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _build_description(spec: Any) -> str:
    """The ninja file FlashInfer would write for ``spec`` now, free of install paths and compiler launchers."""
    from flashinfer.jit.cpp_ext import generate_ninja_build_for_op, get_cuda_path

    text = generate_ninja_build_for_op(
        name=spec.name, sources=spec.sources, extra_cflags=spec.extra_cflags,
        extra_cuda_cflags=spec.extra_cuda_cflags, extra_ldflags=spec.extra_ldflags,
        extra_include_dirs=spec.extra_include_dirs, needs_device_linking=spec.needs_device_linking,
        extra_cuda_cflags_by_source=spec.extra_cuda_cflags_by_source)
    lines = [line for line in text.splitlines() if not line.startswith(_LAUNCHERS)]
    text = "\n".join(lines).replace(f"cuda_home = {get_cuda_path()}\n", "cuda_home = <cuda>\n")
    for path, name in _install_paths():
        text = text.replace(path, name)
    return text


def _versions() -> str:
    from flashinfer import version as flashinfer_version
    from tvm_ffi import __version__ as tvm_ffi_version

    return (f"flashinfer {flashinfer_version.__version__} {flashinfer_version.__git_commit__}|tvm_ffi "
            f"{tvm_ffi_version}|{sys.implementation.cache_tag}|{sysconfig.get_config_var('SOABI')}|"
            f"{platform.machine()}")


def module_identity(spec: Any) -> str:
    """The identity of ``spec``'s module as it would build here now (see the module docstring): 64 hex characters.
    Raises where FlashInfer's build description or a compiler's version cannot be had."""
    digest = hashlib.sha256(f"flashinfer-module|{spec.name}|{_versions()}\n".encode())
    digest.update(_compilers().encode())
    digest.update(_build_description(spec).encode())
    for source in spec.sources:
        digest.update(hashlib.sha256(Path(source).read_bytes()).digest())
    return digest.hexdigest()


# -- the library and its marker ----------------------------------------------------------------------------------

def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _marker(identity: str) -> Path:
    from flashinfer.jit import env

    return Path(env.FLASHINFER_JIT_DIR) / MARKERS / identity


def _placed(spec: Any, identity: str) -> bool:
    """Whether ``spec``'s library is the one its marker names under ``identity``."""
    try:
        recorded = _marker(identity).read_text().strip()
    except OSError:
        return False
    return recorded == _sha256(Path(spec.jit_library_path))


# -- FlashInfer's build, skipped for modules placed here ---------------------------------------------------------

def _skipping_build(original: Any) -> Any:
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            placed = shareable(self) and _placed(self, module_identity(self))
        except Exception:  # noqa: BLE001 - whatever stops the check leaves the build to FlashInfer
            placed = False
        if placed:
            return None
        return original(self, *args, **kwargs)
    return build


def _skip_placed_modules() -> None:
    """From now until ``buildops.testing.reset()``, FlashInfer runs no ninja for a module placed here."""
    from flashinfer.jit.core import JitSpecNvcc

    build_patch.hold("skip placed modules", [JitSpecNvcc], _skipping_build,
                           "FlashInfer 0.7 leaves a JIT module's freshness to ninja, whose state names this node's "
                           "paths: a library installed from the build store would be compiled again")


class FlashInferModule:
    """The artifact of one FlashInfer JIT module's build (the ``Artifact`` contract): its library, one file named
    ``<name>.so``. ``spec`` is the module's ``JitSpecNvcc`` (:func:`shareable`)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._identity: str | None = None

    @property
    def _file(self) -> str:
        return f"{self.spec.name}.so"

    def identity(self) -> str:
        if self._identity is None:
            self._identity = module_identity(self.spec)
        return self._identity

    def known_locally(self) -> bool:
        """True where the library is the one a fetch or a build here left; FlashInfer then builds it no more in
        this process."""
        if not _placed(self.spec, self.identity()):
            return False
        _skip_placed_modules()
        return True

    def install(self, files: Mapping[str, bytes]) -> None:
        """Place the library where FlashInfer loads it, unless one is there; mark it when the library there is the
        fetched one."""
        data = files.get(self._file)
        if data is None:
            return
        library = Path(self.spec.jit_library_path)
        with FileLock(self.spec.lock_path, thread_local=False):  # no ninja of this node writes it meanwhile
            if not library.exists():
                write_atomically(library, data, mode=0o755)
        digest = hashlib.sha256(data).hexdigest()
        if _sha256(library) == digest:
            write_atomically(_marker(self.identity()), digest.encode())
            _skip_placed_modules()

    def collect(self) -> dict[str, bytes] | None:
        try:
            data = Path(self.spec.jit_library_path).read_bytes()
        except OSError:
            return None
        write_atomically(_marker(self.identity()), hashlib.sha256(data).hexdigest().encode())
        return {self._file: data}
