"""Check what a Triton build leaves in Triton's disk cache, so that a bad entry is rebuilt, never reported built.

Triton (3.6 to 3.9 alike; ``versions`` holds the layout) keeps a compiled variant in one directory of
``TRITON_CACHE_DIR`` per key: the files of each stage (``<name>.source``, ``.ttir``, ``.ttgir``, ``.llir``, ``.ptx``,
the binary ``.cubin`` or ``.hsaco``), the metadata ``<name>.json``, and last the group file ``__grp__<name>.json``
whose ``child_paths`` name them all. ``compile()`` treats any entry whose group names an existing metadata file as a
hit and reads it as it is: a cubin truncated to 10 bytes loads from the cache and fails only at the GPU load; an
empty metadata file fails the compile. Triton records no size or hash of the binary, so the check is structural.

Contract of :func:`entry_problem` (the check): an entry passes only if its group file parses and names the
metadata file and the target's binary; every file it names exists and is not empty; the metadata parses as an
object whose ``hash`` is the entry's key (its directory's name); and the binary is an ELF file whose header,
program and section tables and every section's data lie inside the file.

While a build watches its compiles (``worker.watching_compiles``):

- a cache hit on an entry that fails the check is a miss (:func:`checked_group`): the entry's directory is
  deleted and Triton compiles the variant again, which then counts as compiled, not cached;
- a compile whose new entry fails the check raises :class:`BadCacheEntry` (:func:`check_new_entry`), before
  Triton keeps the kernel in memory; ``worker.warmup`` deletes it and builds once more, and fails the build if
  the second entry is bad too.

Only the bad entry's directory is deleted, and only one directly inside ``knobs.cache.dir``. Torch-free: the worker
process imports this.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import struct
import uuid
from typing import Any

from ..._runtime.patching import Patch
from .versions import BINARY_EXTENSIONS, GROUP_PREFIX, entry_names

__all__ = ["BadCacheEntry", "check_new_entry", "checked_group", "discard", "elf_problem", "entry_problem"]

logger = logging.getLogger("buildops")

_SHT_NOBITS = 8  # a section with no data in the file (.bss)


class BadCacheEntry(RuntimeError):
    """A variant's Triton cache entry fails the check: ``kernel`` (its name), ``path`` (the bad file, or the
    entry's directory) and ``problem`` (what is wrong with it)."""

    def __init__(self, kernel: str, path: str, problem: str, again: bool = False) -> None:
        self.kernel, self.path, self.problem, self.again = kernel, path, problem, again
        when = "again after a rebuild" if again else "just after its compile"
        super().__init__(f"Triton's cache entry of kernel {kernel!r} is bad {when}: {path}: {problem}")

    def __reduce__(self) -> tuple[Any, tuple[str, str, str, bool]]:
        return type(self), (self.kernel, self.path, self.problem, self.again)  # raised in a worker process


def elf_problem(data: bytes) -> str | None:
    """What is wrong with ``data`` as an ELF file (a cubin or hsaco), or None: the magic and identification, the
    header, the program and section header tables, and each section's data must lie inside it."""
    size = len(data)
    if size < 16 or data[:4] != b"\x7fELF":
        return f"not an ELF file ({size} bytes, magic {data[:4]!r})"
    elf_class, order = data[4], data[5]
    if elf_class not in (1, 2) or order not in (1, 2):
        return f"bad ELF identification (class {elf_class}, byte order {order})"
    end = "<" if order == 1 else ">"
    wide = elf_class == 2
    header = struct.Struct(end + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"))
    if size < 16 + header.size:
        return f"ELF header truncated ({size} bytes)"
    (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = header.unpack_from(data, 16)
    if phoff + phnum * phentsize > size:
        return f"program header table ends at byte {phoff + phnum * phentsize}, past the file's {size} bytes"
    if shoff + shnum * shentsize > size:
        return f"section header table ends at byte {shoff + shnum * shentsize}, past the file's {size} bytes"
    section = struct.Struct(end + ("IIQQQQ" if wide else "IIIIII"))  # name, type, flags, addr, offset, size
    if shnum and shentsize < section.size:
        return f"section header entries of {shentsize} bytes, fewer than ELF's {section.size}"
    for index in range(shnum):
        _, kind, _, _, offset, length = section.unpack_from(data, shoff + index * shentsize)
        if kind != _SHT_NOBITS and offset + length > size:
            return f"section {index} ends at byte {offset + length}, past the file's {size} bytes"
    return None


def entry_problem(entry: str, metadata_filename: str) -> tuple[str, str] | None:
    """The first bad file of the cache entry in directory ``entry`` whose metadata file is ``metadata_filename``
    (``<kernel name>.json``), and what is wrong with it; None if the entry passes (see the module's contract)."""
    group_path = os.path.join(entry, GROUP_PREFIX + metadata_filename)
    try:
        with open(group_path, encoding="utf-8") as f:
            children = json.load(f).get("child_paths")
    except FileNotFoundError:
        return group_path, "missing"
    except (OSError, ValueError, AttributeError) as exc:
        return group_path, f"unreadable ({type(exc).__name__}: {exc})"
    if not isinstance(children, dict) or metadata_filename not in children:
        return group_path, f"names no {metadata_filename}"
    for path in children.values():
        try:
            if os.path.getsize(path) == 0:
                return path, "empty"
        except (OSError, TypeError):
            return str(path), "missing"
    metadata_path = children[metadata_filename]
    try:
        with open(metadata_path, encoding="utf-8") as f:
            metadata = json.load(f)
        key, backend = metadata["hash"], metadata["target"]["backend"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return metadata_path, f"unreadable metadata ({type(exc).__name__}: {exc})"
    if os.path.basename(os.path.normpath(entry)) not in entry_names(str(key)):
        return metadata_path, f"its hash {key} is not this entry's key"
    extension = BINARY_EXTENSIONS.get(backend)
    if extension is None:  # a backend whose binary this does not know: the checks above only
        return None
    binary = f"{metadata_filename.removesuffix('.json')}.{extension}"
    if binary not in children:
        return group_path, f"names no {binary}"
    try:
        with open(children[binary], "rb") as f:
            problem = elf_problem(f.read())
    except OSError as exc:
        return children[binary], f"unreadable ({exc})"
    return None if problem is None else (children[binary], problem)


def discard(entry: str) -> bool:
    """Delete the cache entry in directory ``entry``, only if it lies directly inside Triton's cache dir (never
    anything else the user has). It is first renamed, so that no reader sees half of it. Whether it did."""
    from triton import knobs

    cache_dir = knobs.cache.dir
    entry = os.path.realpath(entry)
    if not cache_dir or os.path.dirname(entry) != os.path.realpath(cache_dir):
        return False
    doomed = f"{entry}.bad-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        os.rename(entry, doomed)
    except FileNotFoundError:  # another thread or process removed it first
        return True
    except OSError:
        logger.warning("buildops: cannot remove the bad Triton cache entry %s", entry, exc_info=True)
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def check_new_entry(metadata_group: dict[str, str]) -> None:
    """Check the entry a compile has just written (its ``metadata_group``); raise :class:`BadCacheEntry`
    where it is bad, having deleted it."""
    metadata_filename = next((name for name in metadata_group if name.endswith(".json")), None)
    if metadata_filename is None:
        return
    entry = os.path.dirname(metadata_group[metadata_filename])
    problem = entry_problem(entry, metadata_filename)
    if problem is not None:
        discard(entry)
        raise BadCacheEntry(metadata_filename.removesuffix(".json"), *problem)


def checked_group(original: Any, watching: Any) -> Any:
    """A ``FileCacheManager.get_group`` that, where ``watching()`` (a build watches this thread's compiles),
    first checks the entry of a metadata group it would find; a bad entry is deleted and reported missing (None),
    so that Triton compiles the variant again instead of loading it. It checks before Triton reads the group file:
    Triton 3.6 raises on one that does not parse."""
    def get_group(self: Any, filename: str) -> Any:
        entry = getattr(self, "cache_dir", None)
        if (watching() and filename.endswith(".json") and entry
                and os.path.exists(os.path.join(entry, GROUP_PREFIX + filename))):
            problem = entry_problem(entry, filename)
            # discard is False for an entry outside the cache dir (Triton's dump or override dirs): left as it is
            if problem is not None and discard(entry):
                logger.warning("buildops: Triton's cache entry of kernel %r is bad (%s: %s); building it again",
                               filename.removesuffix(".json"), *problem)
                return None
        return original(self, filename)
    return get_group


@functools.cache
def group_patch(watching: Any) -> Patch:
    """The patch of ``FileCacheManager.get_group`` (made on first use: Triton is imported lazily)."""
    from triton.runtime.cache import FileCacheManager

    return Patch(FileCacheManager, "get_group", lambda original: checked_group(original, watching),
                 "Triton 3.6-3.7 take any cache entry whose group names an existing metadata file as a hit and load "
                 "it as it is (a truncated cubin fails only at the GPU load): while a build compiles, buildops "
                 "checks the entry first and makes a bad one a miss")
