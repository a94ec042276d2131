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
import platform
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from ..._runtime.files import write_atomically
from ..._runtime.toolchain import tool_version
from . import build_patch, versions

__all__ = ["FlashInferModule"]

MARKERS = "buildops-shared"  # a directory of FlashInfer's JIT dir: the libraries placed or built, by identity


# -- identity ----------------------------------------------------------------------------------------------------

def _compilers() -> str:
    """The versions of the compilers FlashInfer's build runs: nvcc and the host's (``CXX``, ``CC``)."""
    return "\n".join(tool_version(command)
                     for command in [versions.nvcc(versions.cuda_home()), *versions.host_compilers()])


def _install_paths() -> list[tuple[str, str]]:
    """This node's install paths as they appear in a build description, with the names that replace them, longest
    first (a path inside another is replaced before it)."""
    roots = {**versions.install_roots(), "<python-include>": Path(sysconfig.get_path("include"))}
    pairs = {(str(path), name) for name, root in roots.items() for path in (root, root.resolve())}
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def _build_description(spec: Any) -> str:
    """The ninja file FlashInfer would write for ``spec`` now, free of install paths and compiler launchers."""
    text = versions.build_description(spec)
    lines = [line for line in text.splitlines() if not line.startswith(versions.NINJA_LAUNCHER_LINES)]
    text = "\n".join(lines).replace(versions.cuda_home_line(versions.cuda_home()), versions.cuda_home_line("<cuda>"))
    for path, name in _install_paths():
        text = text.replace(path, name)
    return text


def _versions() -> str:
    return (f"{versions.versions()}|{sys.implementation.cache_tag}|{sysconfig.get_config_var('SOABI')}|"
            f"{platform.machine()}")


def module_identity(spec: Any) -> str:
    """The identity of ``spec``'s module as it would build here now (see the module docstring): 64 hex characters.
    Raises where FlashInfer's build description or a compiler's version cannot be had."""
    digest = hashlib.sha256(f"flashinfer-module|{spec.name}|{_versions()}\n".encode())
    digest.update(_compilers().encode())
    digest.update(_build_description(spec).encode())
    for source in versions.sources(spec):
        digest.update(hashlib.sha256(Path(source).read_bytes()).digest())
    return digest.hexdigest()


# -- the library and its marker ----------------------------------------------------------------------------------

def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _marker(identity: str) -> Path:
    return versions.jit_dir() / MARKERS / identity


def _placed(spec: Any, identity: str) -> bool:
    """Whether ``spec``'s library is the one its marker names under ``identity``."""
    try:
        recorded = _marker(identity).read_text().strip()
    except OSError:
        return False
    return recorded == _sha256(versions.library_path(spec))


# -- FlashInfer's build, skipped for modules placed here ---------------------------------------------------------

def _skipping_build(original: Any) -> Any:
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            placed = versions.shareable(self) and _placed(self, module_identity(self))
        except Exception:  # noqa: BLE001 - whatever stops the check leaves the build to FlashInfer
            placed = False
        if placed:
            return None
        return original(self, *args, **kwargs)
    return build


def _skip_placed_modules() -> None:
    """From now until ``buildops.testing.reset()``, FlashInfer runs no ninja for a module placed here."""
    build_patch.hold("skip placed modules", [versions.nvcc_spec_class()], _skipping_build,
                     "FlashInfer 0.7 leaves a JIT module's freshness to ninja, whose state names this node's "
                     "paths: a library installed from the build store would be compiled again")


class FlashInferModule:
    """The artifact of one FlashInfer JIT module's build (the ``Artifact`` contract): its library, one file named
    ``<name>.so``. ``spec`` is the module's ``JitSpecNvcc`` (:func:`.versions.shareable`)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._identity: str | None = None

    @property
    def _file(self) -> str:
        return versions.library_path(self.spec).name

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
        library = versions.library_path(self.spec)
        with FileLock(versions.lock_path(self.spec), thread_local=False):  # no ninja of this node writes it meanwhile
            if not library.exists():
                write_atomically(library, data, mode=0o755)
        digest = hashlib.sha256(data).hexdigest()
        if _sha256(library) == digest:
            write_atomically(_marker(self.identity()), digest.encode())
            _skip_placed_modules()

    def collect(self) -> dict[str, bytes] | None:
        try:
            data = versions.library_path(self.spec).read_bytes()
        except OSError:
            return None
        write_atomically(_marker(self.identity()), hashlib.sha256(data).hexdigest().encode())
        return {self._file: data}
