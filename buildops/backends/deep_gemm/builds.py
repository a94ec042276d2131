"""DeepGEMM builds: one per kernel a weight shape needs (:class:`.runs.GemmRun`), and one per width of the
activations' scales (:class:`.runs.ScalesRun`); and the op family that lists them from a model.

Where :mod:`.heuristics` reproduces DeepGEMM's choice of kernel (its version and the GPU's architecture), a
shape's builds are one per tiling its Ms pick, each running the smallest M of its tiling: every M up to the bound
is covered, and the builds run side by side, the biggest tiles' first. Elsewhere a shape's build runs every M of its
sweep (``BUILDOPS_DEEP_GEMM_M``) one after another."""

from __future__ import annotations

import functools
import logging
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..._core.build import Build
from .heuristics import Tiling, tilings, why_not_predicted
from .knobs import (
    device_arch,
    device_sms,
    engine_knobs,
)
from .late import note_module
from .runs import GemmRun, ScalesRun
from .shapes import GemmShape, checked_grouped, contiguous_rows, find_gemm_shapes, shape_ms
from .versions import (
    ALIGNMENT_KNOB,
    BLOCK,
    DEFAULT_ALIGNMENT,
    SCALES_COPY,
    SMS_KNOB,
    UNREAD_KNOB,
    library_version,
)

__all__ = ["NOT_PREDICTED", "DeepGemmFamily", "deep_gemm_builds"]

logger = logging.getLogger("buildops")


def deep_gemm_builds(shapes: Iterable[GemmShape], max_tokens: int, *, op: str = "deep_gemm",
                     device: torch.device | str | None = None, mode: str | None = None,
                     module: str = "deep_gemm", top_k: int = 1) -> list[Build]:
    """The builds of ``shapes`` for up to ``max_tokens`` tokens (see the module docstring): a build per kernel
    where DeepGEMM's choice is predicted, else one per distinct shape and M set; and one per width of the
    activations' scales. A ``contiguous`` shape's Ms go up to :func:`contiguous_rows`: its M is the padded rows,
    not the tokens.

    Args:
        shapes: the weight shapes to build.
        max_tokens: the largest number of tokens (see :func:`m_values`).
        op: the op the builds are reported under.
        device: the GPU the runs go to (default: the current one, or the CPU without a GPU).
        mode: the M sweep, as for :func:`m_values`.
        module: the module that provides DeepGEMM's API (tests pass a fake with the same signatures).
        top_k: the experts each token is routed to (the rows per token of a ``contiguous`` shape).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"deep_gemm_builds({op!r}) top_k={top_k!r}: expected an int >= 1")
    try:
        if isinstance(max_tokens, bool):
            raise TypeError
        max_tokens = operator.index(max_tokens)  # an int, or a NumPy or torch integer
    except TypeError:
        raise TypeError(f"deep_gemm_builds({op!r}) max_tokens={max_tokens!r}: expected an int, the most tokens a "
                        f"forward takes") from None
    shapes = list(shapes)
    for shape in shapes:
        if not isinstance(shape, GemmShape):
            raise TypeError(f"deep_gemm_builds({op!r}) shapes: {shape!r} is not a GemmShape; make one with "
                            f"GemmShape('dense', n, k) or GemmShape('contiguous', n, k, experts)")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    knobs = engine_knobs(module, device)
    changed = dict(knobs)
    sms = changed.get(SMS_KNOB) or device_sms(device)
    align_m = changed.get(ALIGNMENT_KNOB) or DEFAULT_ALIGNMENT
    # The GPU's kind, not its index, in each key: the ranks of a node on GPUs of one kind need the same kernels,
    # and one key makes one of them compile them (node claims) while the others load them from the shared cache.
    arch = device_arch(device)
    why_not = why_not_predicted(library_version(module), arch)
    if why_not is None and UNREAD_KNOB in changed:
        why_not = f"its {UNREAD_KNOB} setting is not reproduced"
    if why_not is not None:
        _say_not_predicted(why_not)
    note_module(module)
    builds: dict[tuple, Build] = {}

    def add(key: tuple, label: str, kind: type[GemmRun | ScalesRun], **what: Any) -> None:
        run = kind(module, str(device), op, knobs if kind is GemmRun else (), key=key, **what)
        builds[key] = Build(op, key, run, uses_gpu=device.type == "cuda", label=label, library="deep_gemm",
                            artifact=run.artifact, abandon=run.abandon)

    widths = set()
    for shape in shapes:
        ms = shape_ms(shape, max_tokens, mode, sms, top_k, align_m)
        if not ms:
            continue
        widths.add(math.ceil(shape.k / BLOCK))
        name = shape.describe()
        if why_not is not None:
            add(("deep_gemm", module, shape, ms, knobs, arch, sms), f"{name} x {len(ms)} M", GemmRun, shape=shape,
                ms=ms)
            continue
        for tiling, covered in _by_tiling(shape, max_tokens, top_k, sms, align_m).items():
            rows = "rows" if shape.kind == "contiguous" else "M"
            add(("deep_gemm", module, shape, tiling, knobs, arch, sms),
                f"{name} {tiling} for {rows} {covered[0]}-{covered[-1]}", GemmRun, shape=shape, ms=(covered[0],),
                tiling=tiling, sms=sms)
    for width in sorted(widths):
        add(("deep_gemm", module, SCALES_COPY, width, arch), f"{SCALES_COPY} x {width}", ScalesRun,
            scales_per_row=width)
    # The builds start in this order: the longest first, so that the pass does not end on one of them alone.
    return sorted(builds.values(), key=_compile_cost, reverse=True)


def _compile_cost(build: Build) -> tuple[bool, int]:
    """How long a build's compile takes, as an order: a GEMM's before a scales copy's (a small kernel); a bigger
    tile's first, whose kernel takes longer (more registers, more unrolled MMAs: 7-13 s for 128x160 and 128x192
    tiles against 3.4 s for the median build on the GPU host, docs/decisions/0026); sweeps (no tiling) in their
    listing order."""
    run = build.run
    tiling = getattr(run, "tiling", None)
    return isinstance(run, GemmRun), tiling.block_m * tiling.block_n if tiling is not None else 0


# What the log says, once per reason, where a shape's builds are not one per predicted kernel
NOT_PREDICTED = "buildops: DeepGEMM builds run every M of their sweep: "


@functools.cache
def _say_not_predicted(why: str) -> None:
    """Said once per reason: such builds make many times the GEMM runs of predicted ones, a slower pass."""
    logger.info("%s%s", NOT_PREDICTED, why)


def _by_tiling(shape: GemmShape, max_tokens: int, top_k: int, sms: int, align_m: int) -> dict[Tiling, list[int]]:
    """Every M of a call up to ``max_tokens`` tokens (a contiguous shape's: each multiple of the alignment up to
    its :func:`contiguous_rows`), by the tiling DeepGEMM picks for it."""
    if shape.kind == "contiguous":
        ms = range(align_m, contiguous_rows(max_tokens, shape.experts, top_k, align_m) + 1, align_m)
    else:
        ms = range(1, max_tokens + 1)
    return tilings(shape.kind, ms, shape.n, shape.k, shape.experts, sms, align_m)


class DeepGemmFamily:
    """An op family (see :func:`buildops.model_created`) for models with FP8 weights: DeepGEMM builds of every
    weight shape, for M up to ``max_tokens(config)``; the shapes come from the parameters' shapes, so the builds
    can start before the weights are loaded.

    Args:
        max_tokens: the largest number of tokens, given the model's config.
        grouped: as for :func:`find_gemm_shapes`.
        module: as for :func:`deep_gemm_builds`.
        top_k: the experts each token is routed to, given the model's config (default 1).
    """

    name = "deep_gemm"

    def __init__(self, max_tokens: Callable[[Any], int], grouped: Sequence[str] = ("contiguous",),
                 module: str = "deep_gemm", top_k: Callable[[Any], int] | None = None) -> None:
        if not callable(max_tokens):
            raise TypeError(_not_a_function("max_tokens", max_tokens, "config.max_num_batched_tokens"))
        if top_k is not None and not callable(top_k):
            raise TypeError(_not_a_function("top_k", top_k, "config.num_experts_per_tok"))
        self.max_tokens, self.module, self.top_k = max_tokens, module, top_k
        self.grouped = checked_grouped(grouped, "DeepGemmFamily")

    def recognizes(self, model: Any, config: Any) -> bool:
        """Whether ``model`` is a torch module with FP8 weights."""
        return isinstance(model, nn.Module) and bool(find_gemm_shapes(model, self.grouped))

    def builds(self, model: Any, config: Any) -> list[Build]:
        """The DeepGEMM builds of ``model``'s FP8 weight shapes, on the device they are on (the current GPU for
        weights on ``meta``, which have no storage yet)."""
        device = next((p.device for p in model.parameters() if p.dtype == torch.float8_e4m3fn), None)
        if device is not None and device.type == "meta":
            device = None
        return deep_gemm_builds(find_gemm_shapes(model, self.grouped), self.max_tokens(config), op=self.name,
                                device=device, module=self.module, top_k=self.top_k(config) if self.top_k else 1)


def _not_a_function(name: str, given: object, example: str) -> str:
    return (f"DeepGemmFamily({name}={given!r}): expected a function of the model's config, "
            f"e.g. {name}=lambda config: {example}")


