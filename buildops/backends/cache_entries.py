"""Artifacts made of entries of a library's cache directory (one directory per compiled kernel), shared through
the build store: the base of the Triton and DeepGEMM artifacts.

A subclass says where the entries are and how one is read, checked and placed; this class does the rest of the
``Artifact`` contract. Beside the entries, ``<marker root>/buildops-shared/<identity>`` lists the entries a fetch
installed or an upload took for that identity, so that a node whose cache holds them does not ask the store again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._runtime.files import write_atomically

__all__ = ["CacheEntries", "listed_in"]

MARKERS = "buildops-shared"


class CacheEntries:
    """An ``Artifact`` of cache entries. ``run`` is the build's run: its ``entries`` attribute names the entries
    (directory names) the build made or used, set when it returns. Subclasses define :meth:`identity`,
    :meth:`entries_dir`, :meth:`marker_root`, and may refine :meth:`complete`, :meth:`read_entry` and
    :meth:`place_entry`."""

    run: Any

    def identity(self) -> str:
        raise NotImplementedError

    def entries_dir(self) -> Path:
        """The directory the library keeps its entries in."""
        raise NotImplementedError

    def marker_root(self) -> Path:
        """The directory the markers go under (the library's cache root)."""
        return self.entries_dir()

    def complete(self, entry: Path) -> bool:
        """Whether ``entry`` holds what the library needs to find it (default: any file)."""
        try:
            return any(True for _ in entry.iterdir())
        except OSError:
            return False

    def read_entry(self, entry: Path) -> dict[str, bytes]:
        """The files to share of one entry, by name; {} where it has none worth sharing."""
        return {p.name: p.read_bytes() for p in entry.iterdir() if p.is_file() and not p.is_symlink()}

    def place_entry(self, name: str, contents: dict[str, bytes]) -> None:
        """Put one fetched entry in place, whole or not at all, leaving one already there as it is."""
        raise NotImplementedError

    # -- the Artifact contract ---------------------------------------------------------------------------------

    def known_locally(self) -> bool:
        try:
            names = json.loads(self._marker().read_text())
        except (OSError, ValueError):
            return False
        where = self.entries_dir()
        return bool(names) and all(isinstance(n, str) and self.complete(where / n) for n in names)

    def install(self, files: Mapping[str, bytes]) -> None:
        by_entry: dict[str, dict[str, str]] = {}  # entry -> its file's name -> its path in ``files``
        for path in files:
            entry, _, name = path.partition("/")
            if name and "/" not in name:
                by_entry.setdefault(entry, {})[name] = path
        for entry, paths in by_entry.items():  # one entry's bytes in memory at a time (fetched files stream)
            self.place_entry(entry, {name: files[path] for name, path in paths.items()})
        self._installed = set(by_entry)
        self._remember(list(by_entry))

    def collect(self) -> dict[str, bytes] | None:
        return self._collect(self._made())

    def grown_since_install(self) -> dict[str, bytes] | None:
        """For a subclass whose runs' entries are only those that appeared while they ran (``collect_grown``): the
        entries this artifact's install placed and those the run added, or None if it added none. Entries an earlier
        fetch or upload on this node put there (its markers name them) do not count: another process's install
        makes them appear beside a run that compiles nothing."""
        installed = getattr(self, "_installed", None)
        if not installed:
            return None
        grown = self._made() - installed
        if grown:
            grown -= self._marked()
        return self._collect(installed | grown) if grown else None

    def _made(self) -> set[str]:
        return set(getattr(self.run, "entries", None) or ())

    def _collect(self, names: set[str]) -> dict[str, bytes] | None:
        where = self.entries_dir()
        files: dict[str, bytes] = {}
        kept = []
        for entry in sorted(names):
            try:
                contents = self.read_entry(where / entry) if self.complete(where / entry) else {}
            except (OSError, ValueError):
                continue
            if contents:
                kept.append(entry)
                files.update({f"{entry}/{name}": data for name, data in contents.items()})
        if not files:
            return None
        self._remember(kept)
        return files

    def _marked(self) -> set[str]:
        """The entries every marker of this cache names."""
        try:
            return listed_in((self.marker_root() / MARKERS).iterdir())
        except OSError:
            return set()

    def _marker(self) -> Path:
        return self.marker_root() / MARKERS / self.identity()

    def _remember(self, names: list[str]) -> None:
        write_atomically(self._marker(), json.dumps(sorted(names)))


def listed_in(markers: Iterable[Path]) -> set[str]:
    """The entries the marker files ``markers`` name (JSON lists of entry names); one unreadable names none."""
    names: set[str] = set()
    for marker in markers:
        try:
            listed = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(listed, list):
            names.update(name for name in listed if isinstance(name, str))
    return names
