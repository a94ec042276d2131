"""Triton builds as manifest entries (``buildops.manifests``), and back as builds that compile without a GPU.

An entry holds what a worker needs to compile the variant again: the kernel as source (:mod:`.shipping`) or by
import path, the launch's arguments (stand-ins) and keyword options, pickled and base64-encoded; the build key
and the target; and the identity under which the build store keeps its artifact (:mod:`.entries`). A machine whose
Triton install, ptxas, Python or Triton settings give another identity refuses the entry: what it would compile
could differ from what the engine's nodes look up.
"""

from __future__ import annotations

import base64
import pickle
import platform
import sys
from typing import Any

from ..._core.build import Build, Outcome
from .build import WarmupRun, importable_reference
from .entries import TritonEntries
from .shipping import ShippedKernel, describe
from .worker import prebuild, workers

__all__ = ["entry", "prebuild_build"]


class _KeyText(str):
    """A build key read back from a manifest: its ``repr`` is the original key's, so identities match."""

    def __repr__(self) -> str:
        return str(self)


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode()


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))  # a manifest is trusted like code: it holds kernels' source


def _versions() -> dict[str, str]:
    import triton

    python = "{}.{}".format(*sys.version_info[:2])
    return {"triton": triton.__version__, "python": python, "machine": platform.machine()}


def entry(build: Build) -> dict[str, Any] | str:
    """The manifest entry of a Triton build, or why it has none."""
    run, artifact = build.run, build.artifact
    if not isinstance(run, WarmupRun) or not isinstance(artifact, TritonEntries):
        return "not a compile of one recorded launch (an autotuning or an interpreted run)"
    shipped = describe(run.jit)
    if isinstance(shipped, ShippedKernel):
        kernel: dict[str, Any] = {"source": _encode(shipped)}
    else:
        reference = importable_reference(run.jit)
        if reference is None:
            return f"its kernel neither travels as source ({shipped}) nor can be imported by name"
        kernel = {"import": list(reference)}
    try:
        launch = _encode((run.args, run.kwargs))
    except Exception as error:  # noqa: BLE001 - whatever stops them pickling
        return f"its launch's arguments do not pickle ({type(error).__name__})"
    # cache_key: the kernel's source hash, which a kernel imported by name on the prebuilding machine must match
    return {"library": "triton", "op": build.op, "label": build.label, "key": repr(build.key),
            "target": list(artifact.target), "identity": artifact.identity(), "versions": _versions(),
            "kernel": kernel, "cache_key": run.jit.cache_key, "launch": launch}


class PrebuildRun:
    """A manifest entry's run (the ``Build`` contract): compile in a worker process, never load."""

    def __init__(self, label: str, kernel: Any, args: tuple, kwargs: dict, target: tuple[str, int, int],
                 expected_key: str | None = None) -> None:
        self.label, self.kernel, self.args, self.kwargs, self.target = label, kernel, args, kwargs, target
        self.expected_key = expected_key  # the kernel's source hash where the manifest was saved
        self.entries: set[str] = set()

    def __call__(self) -> Outcome:
        from triton import knobs

        compiled, used = workers.run(self.label, prebuild, self.kernel, self.args, self.kwargs, knobs.cache.dir,
                                     self.target, self.expected_key)
        self.entries = set(used)
        return Outcome(cached=None if compiled is None else not compiled)


def prebuild_build(item: dict[str, Any]) -> Build | str:
    """The build of a manifest entry, or why this machine refuses it."""
    target = tuple(item["target"])
    artifact = TritonEntries(_KeyText(item["key"]), target, None)
    if artifact.identity() != item["identity"]:
        mine, theirs = _versions(), item.get("versions", {})
        differ = [f"{name} {theirs.get(name)} there, {value} here" for name, value in mine.items()
                  if theirs.get(name) != value]
        return ("made with another Triton install or settings (" + ("; ".join(differ) or
                "same versions: the install's contents, ptxas or TRITON_* settings differ") + ")")
    kernel = item["kernel"]
    shipped = tuple(kernel["import"]) if "import" in kernel else _decode(kernel["source"])
    args, kwargs = _decode(item["launch"])
    run = PrebuildRun(item.get("label", ""), shipped, args, kwargs, target,  # type: ignore[arg-type]
                      item.get("cache_key"))
    artifact.run = run
    return Build(item.get("op", "prebuild"), artifact.key, run, label=item.get("label", ""), library="triton",
                 artifact=artifact)
