"""DeepGEMM builds as manifest entries (``buildops.manifests``), and back as builds: ``buildops prebuild`` on a
machine with a GPU but not the model (a container image's build step on a GPU runner) fills DeepGEMM's cache and
the build store with the kernels the engine's pass listed.

DeepGEMM compiles a kernel by running it, so a prebuild needs a GPU of the architecture the manifest was saved on,
with at least as many multiprocessors as the kernels were tiled for (they are set in the worker as the engine had
them). An entry holds what the build runs (the shape, its Ms and the predicted tiling, or the scales' width),
DeepGEMM's settings and the identity under which the build store keeps the kernels; a machine on which that identity
differs (another DeepGEMM version or install path, nvcc, ``DG_*`` settings or machine type) refuses it: its kernels
would be others.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import torch

from ..._core.build import Build
from .entries import DeepGemmEntries
from .heuristics import Tiling
from .knobs import device_arch, device_sms
from .runs import GemmRun, ScalesRun
from .shapes import GemmShape
from .versions import SMS_KNOB, library_version

__all__ = ["entry", "prebuild_build"]


class _KeyText(str):
    """A build key read back from a manifest: its ``repr`` is the original key's, so identities match."""

    def __repr__(self) -> str:
        return str(self)


def entry(build: Build) -> dict[str, Any] | str:
    """The manifest entry of a DeepGEMM build."""
    run, artifact = build.run, build.artifact
    if isinstance(run, GemmRun):
        shape = run.shape
        what: dict[str, Any] = {"gemm": [shape.kind, shape.n, shape.k, shape.experts], "ms": list(run.ms)}
        if run.tiling is not None:  # predicted: a prebuild takes its one kernel's entry, as the pass did
            what["tiling"] = dataclasses.astuple(run.tiling)
    elif isinstance(run, ScalesRun):
        what = {"scales_per_row": run.scales_per_row}
    else:
        return "not a DeepGEMM build of buildops' own"
    assert isinstance(artifact, DeepGemmEntries)
    device = torch.device(run.device)
    return {"library": "deep_gemm", "op": build.op, "label": build.label, "key": repr(build.key),
            "identity": artifact.identity(), "module": run.module, "version": library_version(run.module),
            "arch": device_arch(device), "sms": device_sms(device), "knobs": [list(knob) for knob in run.knobs],
            **what}


def prebuild_build(item: dict[str, Any]) -> Build | str:
    """The build of a manifest entry on this machine's current GPU, or why this machine refuses it."""
    module = item["module"]
    if importlib.util.find_spec(module) is None:
        return f"DeepGEMM is not installed here (no module {module!r}): its kernels compile by running it"
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    arch, sms = device_arch(device), device_sms(device)
    if arch != item["arch"]:
        return f"made for {item['arch']}, and this machine's device is {arch}: DeepGEMM compiles by running"
    knobs = dict(item["knobs"])
    tiled_for = knobs.get(SMS_KNOB, item["sms"])
    if tiled_for > sms:
        return f"its kernels are tiled for {tiled_for} multiprocessors, and this GPU has {sms}"
    knobs.setdefault(SMS_KNOB, tiled_for)  # this GPU's own count may differ: the kernels must not
    key = _KeyText(item["key"])
    label, op, ran_with = item.get("label", ""), item.get("op", "prebuild"), tuple(knobs.items())
    if "gemm" in item:
        kind, n, k, experts = item["gemm"]
        tiling = Tiling(*item["tiling"]) if "tiling" in item else None
        run: GemmRun | ScalesRun = GemmRun(module, str(device), op, ran_with, key=key,
                                           shape=GemmShape(kind, n, k, experts), ms=tuple(item["ms"]),
                                           tiling=tiling, sms=tiled_for if tiling is not None else 0)
    else:
        run = ScalesRun(module, str(device), op, ran_with, key=key, scales_per_row=item["scales_per_row"])
    artifact = run.artifact
    if artifact.identity() != item["identity"]:
        here = library_version(module)
        return (f"made with another DeepGEMM install, nvcc or DG_* settings (DeepGEMM {item['version']} there, "
                f"{here} here; or its install path, nvcc's version, the DG_* variables or the machine type differ)")
    return Build(op, key, run, uses_gpu=device.type == "cuda", label=label, library="deep_gemm", artifact=artifact,
                 abandon=run.abandon)
