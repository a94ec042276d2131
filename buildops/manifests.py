"""Manifests: what a build pass listed, saved so that ``buildops prebuild`` builds it all again without a GPU and
without the model, into the local caches and the build store (a container image's build step, a CI job).

A manifest is JSON: ``{"format": "buildops-manifest", "version": 1, "buildops": VERSION, "entries": [...]}``. Each
entry names its ``library``, ``op`` and ``label``; one that can be prebuilt carries its library's recipe (made by the
``recipes`` its backend registered, :class:`~buildops._core.extensions.Backend`), one that cannot says why in
``"not_prebuilt"``. A manifest holds
kernels' source and pickled launch arguments: load only manifests you would run as code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._core import extensions
from ._core.build import Build, BuildState
from ._core.default import current_builder, default_builder
from ._runtime.files import read_json, write_atomically
from ._version import __version__

__all__ = ["PrebuildOutcome", "load_manifest", "prebuild", "save_manifest"]

FORMAT, VERSION = "buildops-manifest", 1


def manifest_entries() -> list[dict[str, Any]]:
    """The entries of every build this process's builder was given (cancelled ones left out), in order."""
    builder = current_builder()
    if builder is None:
        return []
    seen, entries = set(), []
    for record in builder.history():
        build = record.build
        if record.state is BuildState.CANCELLED or build.key in seen:
            continue
        seen.add(build.key)
        entries.append(_entry(build))
    return entries


def _recipes(library: object) -> Any:
    """The recipes module of the backend registered as ``library`` (the ``Backend`` contract), or None."""
    backend = extensions.backend(library) if isinstance(library, str) else None
    return None if backend is None or backend.recipes is None else extensions.load(backend.recipes)


def _entry(build: Build) -> dict[str, Any]:
    recipes = _recipes(build.library)
    if recipes is not None:
        made = recipes.entry(build)
        if isinstance(made, dict):
            return made
        why = made
    else:
        why = (f"{build.library or 'this kind of'} builds have no recipe a machine without a GPU and the model can "
               "run: they are built by the engine's own pass")
    return {"library": build.library, "op": build.op, "label": build.describe(), "not_prebuilt": why}


def save_manifest(path: str | os.PathLike[str]) -> Path:
    """Write what this process's builds listed as a manifest at ``path`` (atomically); returns the path."""
    target = Path(path)
    document = {"format": FORMAT, "version": VERSION, "buildops": __version__, "entries": manifest_entries()}
    write_atomically(target, json.dumps(document))
    return target


def load_manifest(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of the manifest at ``path``; ``ValueError`` naming the file if it is not one."""
    try:
        document = read_json(path, "buildops manifest")
    except OSError as error:
        raise ValueError(f"{path}: not a readable buildops manifest ({error.strerror or error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path}: not a buildops manifest (no \"format\": \"{FORMAT}\")")
    if document.get("version") != VERSION:
        raise ValueError(f"{path}: manifest version {document.get('version')!r}; this buildops reads {VERSION}")
    entries = document.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: \"entries\" is not a list of objects")
    return entries


@dataclass
class PrebuildOutcome:
    """What ``prebuild`` did with each entry: ``compiled`` here, found ``cached`` locally, ``fetched`` from the
    build store, ``failed`` (label, error), ``refused`` (label, why this machine will not build it) and
    ``not_prebuilt`` (label, why the manifest has no recipe for it)."""

    compiled: int = 0
    cached: int = 0
    fetched: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    not_prebuilt: list[tuple[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"compiled": self.compiled, "cached": self.cached, "fetched": self.fetched,
                "failed": [list(f) for f in self.failed], "refused": [list(r) for r in self.refused],
                "not_prebuilt": [list(n) for n in self.not_prebuilt]}


def prebuild(path: str | os.PathLike[str]) -> PrebuildOutcome:
    """Build every entry of the manifest at ``path`` on this process's builder, into the libraries' local caches
    and, with ``BUILDOPS_STORE`` set, the build store; then wait for them. An entry this machine cannot build as
    the manifest's machine did (another Triton, Python, target support) is refused with the reason."""
    outcome = PrebuildOutcome()
    builds: list[Build] = []
    for item in load_manifest(path):
        label = str(item.get("label", "?"))
        if "not_prebuilt" in item:
            outcome.not_prebuilt.append((label, str(item["not_prebuilt"])))
            continue
        made = _build(item)
        if isinstance(made, str):
            outcome.refused.append((label, made))
        else:
            builds.append(made)
    builder = default_builder()
    futures = [(build, builder.submit(build)) for build in builds]
    builder.join()
    states = {record.build.key: record for record in builder.history()}
    for build, future in futures:
        record = states.get(build.key)
        error = "cancelled" if future.cancelled() else future.exception()
        if error is not None or record is None:
            why = error if isinstance(error, str) else f"{type(error).__name__}: {error}" if error else "not run"
            outcome.failed.append((build.describe(), why))
        elif record.origin == "store":
            outcome.fetched += 1
        elif record.cached:
            outcome.cached += 1
        else:
            outcome.compiled += 1
    return outcome


def _build(item: dict[str, Any]) -> Build | str:
    try:
        recipes = _recipes(item.get("library"))
        if recipes is None:
            return f"no recipe for library {item.get('library')!r} in this buildops"
        return recipes.prebuild_build(item)
    except Exception as error:  # noqa: BLE001 - a malformed or foreign entry is refused, not fatal
        return f"the entry cannot be read here ({type(error).__name__}: {error})"
