"""A DeepGEMM build's run: its GEMMs on dummy operands, in a worker process (or on a builder thread), filling
DeepGEMM's disk cache."""

from __future__ import annotations

import functools
import importlib
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..._config import settings
from ..._core.build import Outcome
from ..._runtime.gpu import run_admitted
from .entries import DeepGemmEntries, entries_being_made, entry_names, making_entries, own_entries
from .heuristics import Tiling, stages
from .knobs import Knobs, on_device, set_in_worker
from .late import note_built
from .shapes import GemmShape, align, rows_for
from .versions import (
    BLOCK,
    GEMM_TEMPLATE,
    GEMM_TYPES,
    KERNEL_NAMES,
    KINDS,
    MAJOR_K,
    MASKED_ROWS,
    PLAIN_EPILOGUE,
    SCALE_ROWS_ALIGNMENT,
    SCALES_COPY,
    SCALES_TEMPLATE,
    call,
    contiguous_alignment,
)
from .workers import in_use, pool, sized

__all__ = ["GemmRun", "ScalesRun", "copy_scales", "in_worker", "run_shape"]


@dataclass(frozen=True)
class _CacheRun:
    """A build's run (the ``Build`` contract's ``run``): DeepGEMM calls in a worker process (or on a builder thread
    with ``BUILDOPS_EXECUTOR=threads``) that fill its disk cache; ``entries`` then holds what appeared there."""

    module: str
    device: str
    op: str
    knobs: Knobs  # engine_knobs(): set in a worker before it runs
    given_up: threading.Event = field(default_factory=threading.Event, compare=False, repr=False, kw_only=True)
    in_worker: threading.Event = field(default_factory=threading.Event, compare=False, repr=False, kw_only=True)
    # new in DeepGEMM's cache while it ran (shared through the store)
    entries: set[str] = field(default_factory=set, compare=False, repr=False, kw_only=True)
    # Set when no other build or install of this process ran beside it: its new entries are then its own compiles
    alone: threading.Event = field(default_factory=threading.Event, compare=False, repr=False, kw_only=True)
    key: Any = field(default=None, compare=False, repr=False, kw_only=True)  # its build's: its artifact's identity

    def abandon(self) -> None:
        """Given up as timed out (``Build`` contract): stop the workers if the run is stuck in one."""
        self.given_up.set()
        if self.in_worker.is_set():
            pool.stop_workers()

    @functools.cached_property
    def artifact(self) -> DeepGemmEntries:
        """Its build's artifact: the entries it makes, under its build's identity."""
        return DeepGemmEntries(self.key, self.module, self.device, self)

    def own_kernel(self) -> tuple[str, dict[str, set[str]]] | None:
        """The one kernel this run makes, as :func:`.entries.own_entries` finds its entry, where that is known."""
        return None

    def __call__(self) -> Outcome:
        own = self.own_kernel()
        if own is not None:
            there = own_entries(*own, among=self.artifact.vouched())
            if there:  # made or installed before, under this identity: nothing to run, no worker to start
                self._took(there)
                return Outcome(cached=True)
        with making_entries():
            making = entries_being_made()
            before = entry_names()
            try:
                self._run()
            finally:
                new = entry_names() - before
                taken = new
                if own is not None:
                    # Its own entry, not those of builds beside it (all it saw made, if none reads as its own); if
                    # it made none, every entry its kernel's code would have (the one DeepGEMM loaded among them).
                    taken = own_entries(*own, among=new) or new
                    if taken:
                        self.artifact.vouch(taken)
                    else:
                        taken = own_entries(*own)
                self._took(taken)
                if making[0] == 1 and entries_being_made() == making:
                    self.alone.set()
        # Nothing new in the cache: its kernels were there. Something new: its own compiles where it ran alone,
        # else maybe another build's.
        return Outcome(cached=True if not new else False if self.alone.is_set() else None)

    def _took(self, entries: set[str]) -> None:
        self.entries.update(entries)
        note_built(self.op, entries)

    def _task(self) -> tuple[str, Callable[..., Any], tuple]:
        """What the run calls: (what it is, the function, its arguments but the reserve and the knobs)."""
        raise NotImplementedError

    def _run(self) -> None:
        reserve = settings.gpu_reserve_mb  # read here: a worker process does not see this process's overrides
        what, fn, args = self._task()
        if settings.executor == "threads":
            fn(*args, reserve)
            return
        self.in_worker.set()
        try:
            with in_use():
                sized(self.device)
                pool.run(what, in_worker, fn, self.device, *args, reserve, self.knobs, given_up=self.given_up)
        finally:
            self.in_worker.clear()


@dataclass(frozen=True)
class GemmRun(_CacheRun):
    """One weight shape's entry point at each of ``ms``; with a ``tiling``, the one kernel DeepGEMM picks for
    them on ``sms`` multiprocessors (:mod:`.heuristics`)."""

    shape: GemmShape
    ms: tuple[int, ...]
    tiling: Tiling | None = None
    sms: int = 0

    def own_kernel(self) -> tuple[str, dict[str, set[str]]] | None:
        tiling, shape = self.tiling, self.shape
        if tiling is None:
            return None
        return KERNEL_NAMES[shape.kind], {
            "template": {GEMM_TEMPLATE}, "gemm_type": {GEMM_TYPES[shape.kind]}, "major_sfb": {MAJOR_K},
            "n": {str(shape.n)}, "k": {str(shape.k)}, "groups": {str(shape.experts)},
            "block_m": {str(tiling.block_m)}, "block_n": {str(tiling.block_n)},
            "stages": {str(stages(tiling, shape.k))}, "cluster_size": {str(tiling.cluster_m * tiling.cluster_n)},
            "multicast_on_a": {"true" if tiling.cluster_n > 1 else "false"}, "sms": {str(self.sms)},
            "epilogue": {PLAIN_EPILOGUE}}

    def _task(self) -> tuple[str, Callable[..., Any], tuple]:
        at = f" {self.tiling} at M {self.ms[0]}" if self.tiling else f" x {len(self.ms)} M"
        return self.shape.describe() + at, run_shape, (self.module, self.shape, self.ms, self.device)


@dataclass(frozen=True)
class ScalesRun(_CacheRun):
    """DeepGEMM's copy of row-major activation scales into its MN-major, TMA-aligned layout, for ``ceil(K / 128)``
    scales a row: a kernel of its own per width, which every GEMM given such scales runs first."""

    scales_per_row: int

    def own_kernel(self) -> tuple[str, dict[str, set[str]]] | None:
        return KERNEL_NAMES["scales"], {"template": {SCALES_TEMPLATE}, "sf_k": {str(self.scales_per_row)}}

    def _task(self) -> tuple[str, Callable[..., Any], tuple]:
        return f"{SCALES_COPY} x {self.scales_per_row}", copy_scales, (self.module, self.scales_per_row, self.device)


def in_worker(fn: Callable[..., int], device: str, *args: Any) -> int:
    """``fn(*args)`` (:func:`run_shape` or :func:`copy_scales`, whose last argument is DeepGEMM's settings for the
    worker) in a build worker process, whose cached GPU memory on ``device`` then goes back to the driver. Torch
    keeps freed operands' memory cached in the process that freed them, where only that process can use it: the
    engine, and the gate's checks in the node's other processes, see what the driver has free."""
    try:
        return fn(*args)
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def run_shape(module: str, shape: GemmShape, ms: Sequence[int], device: str, reserve_mb: int,
              knobs: Sequence[tuple[str, Any]] | None = None) -> int:
    """Run ``shape``'s entry point at every M (in whatever process this is); returns the number of runs.
    ``knobs``: DeepGEMM settings to set first (a worker's only, never the engine's: :mod:`.knobs`)."""
    deep_gemm = importlib.import_module(module)
    entry = getattr(deep_gemm, KINDS[shape.kind])
    dev = torch.device(device)
    with on_device(dev):
        if knobs is not None:
            set_in_worker(deep_gemm, module, knobs)
        align_m = contiguous_alignment(deep_gemm)
    m_max = max(ms)
    # The contiguous kind's calls see rows, not tokens: Ms that pad to the same rows are one call.
    calls = sorted({rows_for(shape, m, align_m) for m in ms}) if shape.kind == "contiguous" else list(ms)

    def make():
        return _operands(shape, m_max, dev, align_m)

    def run(operands):
        for m in calls:
            given, masked_m = operands, None
            if shape.kind == "masked":
                masked_m = torch.full((shape.experts,), m, dtype=torch.int32, device=dev)
            elif m != calls[-1]:  # scales of the call's rows, so that DeepGEMM copies none (a slice it would copy)
                given = {**operands, "a_scale": _mn_major_scales((), m, math.ceil(shape.k / BLOCK), dev)}
            call(entry, shape.kind, given, m, masked_m)

    # The reserve as an argument, not a settings.scope: scopes are process-wide, and builds run side by side.
    run_admitted(dev, shape.operand_bytes(m_max, align_m), make, run, f"DeepGEMM {KINDS[shape.kind]} {shape}",
                 reserve_mb)
    return len(calls)


def copy_scales(module: str, scales_per_row: int, device: str, reserve_mb: int,
                knobs: Sequence[tuple[str, Any]] | None = None) -> int:
    """Run DeepGEMM's copy of row-major activation scales ``scales_per_row`` wide (see :class:`ScalesRun`)."""
    deep_gemm = importlib.import_module(module)
    dev = torch.device(device)
    with on_device(dev):
        if knobs is not None:
            set_in_worker(deep_gemm, module, knobs)
    copy = getattr(deep_gemm, SCALES_COPY)
    rows = SCALE_ROWS_ALIGNMENT  # any rows: the kernel is made for the width

    def make():
        return torch.ones((rows, scales_per_row), dtype=torch.float32, device=dev)

    run_admitted(dev, 2 * rows * scales_per_row * 4, make, copy, f"DeepGEMM {SCALES_COPY} x {scales_per_row}",
                 reserve_mb)
    return 1


def _operands(shape: GemmShape, m_max: int, device: torch.device, align_m: int) -> dict:
    fp8, kb, nb = torch.float8_e4m3fn, math.ceil(shape.k / BLOCK), math.ceil(shape.n / BLOCK)
    rows = rows_for(shape, m_max, align_m)
    if shape.kind == "masked":
        # Each expert's rows (max_m) a multiple of 64, as engines' dispatch buffers are: DeepGEMM does not check
        # it, and its tiles then read and write across experts.
        max_m = align(m_max, MASKED_ROWS)
        a_shape, d_shape = (shape.experts, max_m, shape.k), (shape.experts, max_m, shape.n)
        a_scale = _mn_major_scales((shape.experts,), max_m, kb, device)
    else:
        a_shape, d_shape, a_scale = (rows, shape.k), (rows, shape.n), _mn_major_scales((), rows, kb, device)
    b_shape = (shape.n, shape.k) if shape.kind == "dense" else (shape.experts, shape.n, shape.k)
    b_scale = (nb, kb) if shape.kind == "dense" else (shape.experts, nb, kb)
    operands = {
        "a": torch.empty(a_shape, dtype=fp8, device=device),
        "a_scale": a_scale,
        "b": torch.empty(b_shape, dtype=fp8, device=device),
        "b_scale": torch.ones(b_scale, dtype=torch.float32, device=device),
        "d": torch.empty(d_shape, dtype=torch.bfloat16, device=device),
    }
    if shape.kind == "contiguous":
        # Each block of align_m rows belongs to one expert, all experts in turn, so that every expert's rows start
        # at a multiple of the alignment; the rows after the last token are padding (-1), as DeepGEMM's tests mark
        # them. A prefix of whole blocks keeps that layout.
        layout = (torch.arange(rows, device=device, dtype=torch.int32) // align_m) % shape.experts
        layout[m_max:] = -1
        operands["grouped_layout"] = layout
    return operands


def _mn_major_scales(groups: tuple[int, ...], rows: int, kb: int, device: torch.device) -> torch.Tensor:
    """Activation scales as DeepGEMM's kernels read them: MN-major, each group's rows padded to a multiple of 4
    (TMA-aligned). A call given them copies nothing, so a GEMM's build compiles its GEMM alone; the copy's kernel,
    which engines that pass row-major scales need, is a build of its own (:class:`ScalesRun`)."""
    padded = align(rows, SCALE_ROWS_ALIGNMENT)
    return torch.ones((*groups, kb, padded), dtype=torch.float32, device=device).transpose(-1, -2)[..., :rows, :]
