"""A Triton build's cache entries as an :class:`~buildops._core.build.Artifact`, shared through the build store.

While a build runs, the entries of ``TRITON_CACHE_DIR`` its thread looks up or writes are noted
(:func:`collecting`): the kernel's own entry and, on a GPU, those of its launcher. Triton names each entry by its own
hash of everything that goes into it, so an entry installed from the store under a wrong identity is only never
found, never loaded wrong. A group file (``__grp__<name>.json``) names its files by absolute path: in the store it
names them by file name alone, and an install names them where this node keeps them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import uuid
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..._runtime.patching import Patch
from ..cache_entries import CacheEntries
from .state import triton_state
from .versions import GROUP_PREFIX, cache_invalidating_env, compiler_hash, triton_key

__all__ = ["TritonEntries", "collecting"]


def _noting_init(original: Any) -> Any:
    def __init__(self: Any, key: Any, override: bool = False, dump: bool = False) -> None:
        original(self, key, override, dump)
        entries = getattr(triton_state.noted_entries, "entries", None)
        if entries is not None and not override and not dump:
            entries.add(str(key))
    return __init__


@functools.cache
def _init_patch() -> Patch:
    from triton.runtime.cache import FileCacheManager

    return Patch(FileCacheManager, "__init__", _noting_init,
                 "Triton 3.6-3.7 tell no one which cache entries a compile or a launcher load used: buildops notes "
                 "the entries the building thread opens, to share them through the build store")


@contextlib.contextmanager
def collecting() -> Iterator[set[str]]:
    """Within the block, the name of each entry of Triton's cache dir this thread opens is added to the set."""
    patch = _init_patch()
    entries: set[str] = set()
    outer = getattr(triton_state.noted_entries, "entries", None)
    triton_state.noted_entries.entries = entries
    patch.acquire()
    try:
        yield entries
    finally:
        patch.release()
        triton_state.noted_entries.entries = outer
        if outer is not None:
            outer.update(entries)


def _cache_dir() -> Path:
    from triton import knobs

    return Path(knobs.cache.dir)


@functools.cache
def _install_identity(backend: str, arch: Any, warp_size: int) -> str:
    """What the compiler brings to a kernel's identity: Triton's own hash of its install (contents, not paths), the
    backend's (ptxas's version and the arch), and the Python and machine a launcher is built for."""
    return (f"{triton_key()}|{compiler_hash(backend, arch, warp_size)}|{sys.version_info[:2]}|"
            f"{platform.machine()}")


class TritonEntries(CacheEntries):
    """The artifact of one Triton build (the ``Artifact`` contract): ``key`` is the build's key, ``target`` its
    ``(backend, arch, warp_size)``, ``run`` its run, whose ``entries`` holds what its thread opened."""

    def __init__(self, key: Hashable, target: tuple[str, Any, int], run: Any) -> None:
        self.key, self.target, self.run = key, target, run
        self._identity: str | None = None

    def identity(self) -> str:
        if self._identity is None:
            described = f"triton|{self.key!r}|{_install_identity(*self.target)}|{cache_invalidating_env()}"
            self._identity = hashlib.sha256(described.encode()).hexdigest()
        return self._identity

    def entries_dir(self) -> Path:
        return _cache_dir()

    # A run whose entries are in the local cache (fetched, or marked there) needs no worker process: its warmup in
    # this process is a disk-cache hit.
    def known_locally(self) -> bool:
        found = super().known_locally()
        if found and self.run is not None:
            self.run.in_local_cache = True
        return found

    def install(self, files: Mapping[str, bytes]) -> None:
        super().install(files)
        if self.run is not None:
            self.run.in_local_cache = True

    def rejects(self, files: Mapping[str, bytes]) -> str | None:
        """Why fetched entries must not be loaded here: a binary that is not a whole ELF file (the store's hashes
        were recorded of what its node had), or metadata naming another target than this build's."""
        from .artifacts import elf_problem

        for path in files:  # each file read when checked: fetched files stream from a spool
            entry, _, name = path.partition("/")
            if name.endswith((".cubin", ".hsaco")):
                problem = elf_problem(files[path])
                if problem is not None:
                    return f"{path}: {problem}"
            elif name.endswith(".json") and not name.startswith(GROUP_PREFIX):
                try:
                    target = json.loads(files[path]).get("target") or {}
                except (ValueError, AttributeError):
                    return f"{path}: metadata that is not a JSON object"
                built_for = (target.get("backend"), target.get("arch"), target.get("warp_size"))
                if built_for != tuple(self.target):
                    return f"{entry}: built for {built_for}, this build is for {tuple(self.target)}"
        return None

    def read_entry(self, entry: Path) -> dict[str, bytes]:
        return _read_entry(entry)

    def place_entry(self, name: str, contents: dict[str, bytes]) -> None:
        _install_entry(_cache_dir(), name, contents)


def _read_entry(directory: Path) -> dict[str, bytes]:
    """An entry's files, its group files naming their files by name alone; {} if it has none."""
    contents = {}
    try:
        paths = [p for p in directory.iterdir() if p.is_file() and not p.is_symlink() and p.name != "lock"]
        for path in paths:
            data = path.read_bytes()
            contents[path.name] = _group_by_name(data) if path.name.startswith(GROUP_PREFIX) else data
    except (OSError, ValueError):
        return {}
    return contents


def _group_by_name(data: bytes) -> bytes:
    group = json.loads(data)
    group["child_paths"] = {child: os.path.basename(path) for child, path in group["child_paths"].items()}
    return json.dumps(group).encode()


def _group_here(data: bytes, directory: Path) -> bytes:
    group = json.loads(data)
    group["child_paths"] = {child: str(directory / os.path.basename(name))
                            for child, name in group["child_paths"].items()}
    return json.dumps(group).encode()


def _install_entry(root: Path, entry: str, contents: dict[str, bytes]) -> None:
    """Place one entry's files as ``root/entry``, whole or not at all; an entry already there is left as it is.
    Triton makes an entry's directory when it looks it up, so an empty one is filled (its files renamed in one at
    a time, the group file last: Triton finds the entry only through it)."""
    final = root / entry
    if final.is_dir() and any(final.glob(GROUP_PREFIX + "*")):
        return
    staging = root / f"tmp.buildops.{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        for name, data in contents.items():
            is_group = name.startswith(GROUP_PREFIX)
            (staging / name).write_bytes(_group_here(data, final) if is_group else data)
        try:
            os.rename(staging, final)
            return
        except OSError:  # there already (Triton made it empty, or another process filled it): file by file
            pass
        for name in sorted(contents, key=lambda n: n.startswith(GROUP_PREFIX)):
            if not (final / name).exists():
                os.replace(staging / name, final / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
