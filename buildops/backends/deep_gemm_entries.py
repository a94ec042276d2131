"""A DeepGEMM build's cache entries as an :class:`~buildops._core.build.Artifact`, shared through the build store.

DeepGEMM compiles each kernel into ``<DG_JIT_CACHE_DIR or ~/.deep_gemm>/cache/kernel.<name>.<hash>/`` (its source
``kernel.cu`` and ``kernel.cubin``), made whole in a temporary directory and renamed into place; the hash covers
the kernel's code, nvcc's version and the compile flags (DeepGEMM's include path among them). A build's artifact is
the entries that appeared in that directory while it ran (builds that overlap may each take the others' entries
too: entries are named by their contents, so an extra one is only never looked up). An install renames each whole
entry into place as DeepGEMM does, so DeepGEMM never sees half an entry.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from .._runtime.toolchain import tool_version
from .cache_entries import CacheEntries

__all__ = ["DeepGemmEntries", "cache_root", "entry_names"]

# What an entry must hold: DeepGEMM aborts the process on an entry directory that lacks either.
_REQUIRED = ("kernel.cu", "kernel.cubin")

def cache_root() -> Path:
    """DeepGEMM's cache directory, as its compiler picks it."""
    return Path(os.environ.get("DG_JIT_CACHE_DIR") or Path.home() / ".deep_gemm")


def entry_names() -> set[str]:
    """The kernel entries in DeepGEMM's cache now."""
    try:
        return {p.name for p in (cache_root() / "cache").iterdir() if p.name.startswith("kernel.")}
    except OSError:
        return set()


def _nvcc_version() -> str:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = os.environ.get("DG_JIT_NVCC_COMPILER") or str(Path(cuda_home) / "bin" / "nvcc")
    try:
        return tool_version(shlex.quote(nvcc))
    except (OSError, subprocess.SubprocessError):
        return "no nvcc"  # DeepGEMM may compile with NVRTC instead


def _library_version(module: str) -> str:
    from importlib import metadata

    for name in (module, module.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return str(getattr(sys.modules.get(module), "__version__", "unknown"))


def _device_arch(device: str) -> str:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    major, minor = torch.cuda.get_device_capability(dev)
    return f"sm_{major}{minor}"


class DeepGemmEntries(CacheEntries):
    """The artifact of one DeepGEMM build (the ``Artifact`` contract): ``key`` is the build's key without its device
    index (ranks on other GPUs of one kind share), ``module`` the DeepGEMM module, ``device`` where it runs, ``run``
    the build's run, whose ``entries`` holds the entries that appeared while it ran."""

    def __init__(self, key: Hashable, module: str, device: str, run: Any) -> None:
        self.key, self.module, self.device, self.run = key, module, device, run
        self._identity: str | None = None

    def identity(self) -> str:
        if self._identity is None:
            environment = sorted((k, v) for k, v in os.environ.items()
                                 if k.startswith("DG_") and k != "DG_JIT_CACHE_DIR")
            described = (f"deep_gemm|{self.key!r}|{_library_version(self.module)}|{_device_arch(self.device)}|"
                         f"{_nvcc_version()}|{environment!r}|{platform.machine()}")
            self._identity = hashlib.sha256(described.encode()).hexdigest()
        return self._identity

    def entries_dir(self) -> Path:
        return cache_root() / "cache"

    def marker_root(self) -> Path:
        return cache_root()

    def complete(self, entry: Path) -> bool:
        return all((entry / name).is_file() for name in _REQUIRED)

    def place_entry(self, name: str, contents: dict[str, bytes]) -> None:
        if name.startswith("kernel.") and all(required in contents for required in _REQUIRED):
            _install_entry(cache_root(), name, contents)


def _install_entry(root: Path, entry: str, contents: dict[str, bytes]) -> None:
    """Rename one whole entry into ``root/cache``, as DeepGEMM's compiler does; one already there is kept."""
    final = root / "cache" / entry
    if final.exists():
        return
    staging = root / "tmp" / f"buildops-{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        for name, data in contents.items():
            (staging / name).write_bytes(data)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, final)
        except OSError:  # another process put it there meanwhile
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
