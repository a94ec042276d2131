"""A DeepGEMM build's cache entries as an :class:`~buildops._core.build.Artifact`, shared through the build store.

DeepGEMM compiles each kernel into ``<DG_JIT_CACHE_DIR or ~/.deep_gemm>/cache/kernel.<name>.<hash>/`` (its source
``kernel.cu`` and ``kernel.cubin``), made whole in a temporary directory and renamed into place; the hash covers
the kernel's code, nvcc's version and the compile flags (the absolute path of DeepGEMM's ``include`` directory among
them, so entries made under one install path never hit under another). A build's artifact is
the entries that appeared in that directory while it ran (builds that overlap may each take the others' entries
too: entries are named by their contents, so an extra one is only never looked up). An install renames each whole
entry into place as DeepGEMM does, so DeepGEMM never sees half an entry. The layout and what the hash covers are
named in :mod:`.versions`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..._runtime.files import write_atomically
from ..._runtime.toolchain import tool_version
from ..cache_entries import CacheEntries, listed_in
from . import versions
from .knobs import device_arch
from .state import deep_gemm_state

__all__ = ["DeepGemmEntries", "entries_being_made", "entry_names", "making_entries", "own_entries"]

MADE = "buildops-made"  # beside the build store's markers: the entries each identity's runs made here


def entry_names() -> set[str]:
    """The kernel entries in DeepGEMM's cache now."""
    try:
        return {p.name for p in versions.entries_dir().iterdir() if versions.is_entry(p.name)}
    except OSError:
        return set()


@contextlib.contextmanager
def making_entries() -> Iterator[None]:
    """Mark a DeepGEMM build or store install of this process as adding entries to the cache while it runs."""
    state = deep_gemm_state
    with state.making_lock:
        state.making_now += 1
        state.making_ever += 1
    try:
        yield
    finally:
        with state.making_lock:
            state.making_now -= 1


def entries_being_made() -> tuple[int, int]:
    """(builds and installs under way now, begun ever): what :func:`making_entries` has marked."""
    with deep_gemm_state.making_lock:
        return deep_gemm_state.making_now, deep_gemm_state.making_ever


def own_entries(kernel: str, made_of: Mapping[str, set[str]], among: set[str] | None = None) -> set[str]:
    """The entries of kernel ``kernel`` (:data:`.versions.KERNEL_NAMES`) in the cache, or ``among`` them, whose code
    was made of ``made_of`` (each argument one of its values: :func:`.versions.entry_kernel`). What an entry was made
    of is read once per process: an entry's name is its contents' hash."""
    names = entry_names() if among is None else among
    found = set()
    for name in names:
        if versions.kernel_name(name) != kernel:
            continue
        with deep_gemm_state.making_lock:
            known = name in deep_gemm_state.entry_kernels
            read = deep_gemm_state.entry_kernels.get(name)
        if not known:  # entries are renamed into place whole: one seen is as it stays
            read = versions.entry_kernel(versions.entries_dir() / name)
            with deep_gemm_state.making_lock:
                deep_gemm_state.entry_kernels[name] = read
        if read is not None and all(read.get(argument) in values for argument, values in made_of.items()):
            found.add(name)
    return found


def _nvcc_version() -> str:
    try:
        return tool_version(shlex.quote(versions.nvcc()))
    except (OSError, subprocess.SubprocessError):
        return "no nvcc"  # DeepGEMM may compile with NVRTC instead


class DeepGemmEntries(CacheEntries):
    """The artifact of one DeepGEMM build (the ``Artifact`` contract): ``key`` is the build's key (which names the
    GPU's kind, not its index: ranks on other GPUs of one kind share), ``module`` the DeepGEMM module, ``device``
    where it runs, ``run`` the build's run, whose ``entries`` holds the entries that appeared while it ran."""

    def __init__(self, key: Hashable, module: str, device: str, run: Any) -> None:
        self.key, self.module, self.device, self.run = key, module, device, run
        self._identity: str | None = None

    def identity(self) -> str:
        if self._identity is None:
            described = (f"deep_gemm|{self.key!r}|{versions.library_version(self.module)}|"
                         f"{versions.include_dir(self.module)}|{device_arch(self.device)}|{_nvcc_version()}|"
                         f"{versions.compile_settings()!r}|{platform.machine()}")
            self._identity = hashlib.sha256(described.encode()).hexdigest()
        return self._identity

    def entries_dir(self) -> Path:
        return versions.entries_dir()

    def marker_root(self) -> Path:
        return versions.cache_root()

    def install(self, files: Mapping[str, bytes]) -> None:
        with making_entries():  # a watched call meanwhile must not take these entries for its own compiles
            super().install(files)

    def complete(self, entry: Path) -> bool:
        return all((entry / name).is_file() for name in versions.ENTRY_FILES)

    def collect_grown(self) -> dict[str, bytes] | None:
        # A build's artifact is what appeared in the cache while it ran, so it lacks an entry its node had already
        # (the scales' transpose kernel, shared by the shapes of one K): the node that fetches it and compiles that
        # completes it. The new entries are the run's own compiles only if nothing else of this process ran beside.
        return self.grown_since_install() if self.run.alone.is_set() else None

    def place_entry(self, name: str, contents: dict[str, bytes]) -> None:
        if versions.is_entry(name) and all(required in contents for required in versions.ENTRY_FILES):
            _install_entry(versions.cache_root(), name, contents)

    # DeepGEMM's entry names hash its compile flags and nvcc's version beside the code, so an entry whose code reads
    # as a build's kernel may be another install's, which this one never loads. These say which entries this
    # identity (which covers the same) made or installed: only those spare a build its run.

    def vouched(self) -> set[str]:
        """The entries a run or a store install of this identity put in the cache, and still there whole."""
        where = self.entries_dir()
        return {name for name in listed_in((self._marker(), self._made_marker())) if self.complete(where / name)}

    def vouch(self, names: set[str]) -> None:
        """Note that a run of this identity made ``names``."""
        marker = self._made_marker()
        listed = listed_in((marker,))
        if not names <= listed:
            write_atomically(marker, json.dumps(sorted(listed | names)))

    def _made_marker(self) -> Path:
        return self.marker_root() / MADE / self.identity()


def _install_entry(root: Path, entry: str, contents: dict[str, bytes]) -> None:
    """Rename one whole entry into ``root/cache``, as DeepGEMM's compiler does; one already there is kept."""
    final = versions.entries_dir(root) / entry
    if final.exists():
        return
    staging = versions.staging_dir(root) / f"buildops-{uuid.uuid4().hex}"
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
