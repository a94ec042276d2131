"""DeepGEMM builds by running: its kernels compile the first time they run a shape, so a build runs them.

DeepGEMM has no compile-only API. A build here runs one GEMM entry point (``fp8_gemm_nt`` for dense layers,
``m_grouped_fp8_gemm_nt_contiguous`` / ``m_grouped_fp8_gemm_nt_masked`` for MoE experts) on dummy operands for
one weight shape at every M of a sweep, so that every kernel the layer will need is compiled into DeepGEMM's own
cache before serving. Dummy operands are admitted by the GPU memory gate (``BUILDOPS_GPU_RESERVE_MB``) and the
runs go on a worker stream.

DeepGEMM's binding holds the GIL while it compiles, so a build on a thread would stop every other Python thread of
the process for the whole compile. Builds therefore run in spawned worker processes, each with its own CUDA context,
which fill DeepGEMM's disk cache; the process's own first call then loads the kernel from there
(docs/decisions/0013-deep-gemm-in-worker-processes.md). ``BUILDOPS_EXECUTOR=threads`` keeps them on the builder's
threads instead.

DeepGEMM's process-global settings (``set_num_sms`` and the like) as this process has them when the builds are
made are part of each build's key and are set in the worker before it runs (:mod:`.deep_gemm_knobs`).

Imported on demand; ``deep_gemm`` itself is imported only when a build runs.
"""

from __future__ import annotations

import importlib
import math
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._config import settings
from .._core.build import Build
from .._runtime.gpu import run_admitted
from .._runtime.pools import WorkerPool
from .deep_gemm_entries import DeepGemmEntries, entries_being_made, entry_names, making_entries
from .deep_gemm_knobs import DEFAULT_ALIGNMENT as _ALIGN_M
from .deep_gemm_knobs import DEFAULT_SMS as _DEFAULT_SMS
from .deep_gemm_knobs import (
    Knobs,
    contiguous_alignment,
    device_arch,
    device_sms,
    engine_knobs,
    on_device,
    set_in_worker,
)
from .deep_gemm_late import note_built, note_module

__all__ = ["DeepGemmFamily", "GemmShape", "contiguous_rows", "deep_gemm_builds", "find_gemm_shapes", "m_values",
           "shape_ms"]

KINDS = {
    "dense": "fp8_gemm_nt",
    "contiguous": "m_grouped_fp8_gemm_nt_contiguous",
    "masked": "m_grouped_fp8_gemm_nt_masked",
}
_BLOCK = 128        # DeepGEMM's scaling block along N and K
_MASKED_ROWS = 64   # what each expert's rows in the masked layout must be a multiple of

# What the relaxed M sweep (m_values) knows of DeepGEMM's heuristics:
_MODES = ("relaxed", "full", "off")
_GROUPED = ("contiguous", "masked")
_SMALL_MS = (1, 2, 4, *range(8, 65, 8))   # small Ms, each of which may pick its own kernel
_BLOCK_MS = (64, 128, 256)                # its block heights
_BLOCK_N_STEP, _BLOCK_N_MAX = 16, 256     # its block widths: multiples of 16 up to 256
_MAX_WAVES = 10                           # the whole waves of the GPU's multiprocessors the sweep covers

# Worker processes at most: each holds a CUDA context (hundreds of MiB), and DeepGEMM's nvcc runs use several cores.
_MAX_WORKERS = 4

_pool = WorkerPool("DeepGEMM build", lambda: max(1, min(settings.threads, _MAX_WORKERS)))


@dataclass(frozen=True)
class GemmShape:
    """One weight shape a model runs through DeepGEMM: ``(N, K)`` dense, or ``(E, N, K)`` for a grouped kind.

    Args:
        kind: ``dense``, or ``contiguous`` or ``masked`` for MoE experts (the layout DeepGEMM's grouped GEMM takes).
        n: the output features.
        k: the input features.
        experts: the experts of a grouped kind; 1 for ``dense``.
    """

    kind: str
    n: int
    k: int
    experts: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"GemmShape kind {self.kind!r}: expected one of {sorted(KINDS)}")
        for name in ("n", "k", "experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GemmShape({self.kind!r}) {name}={value!r}: expected an int >= 1")
        if self.kind == "dense" and self.experts != 1:
            raise ValueError("GemmShape('dense') has no experts")

    def operand_bytes(self, m: int, align_m: int = _ALIGN_M) -> int:
        """Bytes of the dummy operands for ``m`` rows (tokens; per expert for ``masked``), and of the copy of the
        activations' scales DeepGEMM makes in each call; ``align_m``: the contiguous layout's row alignment."""
        kb, nb = math.ceil(self.k / _BLOCK), math.ceil(self.n / _BLOCK)
        rows = _rows(self, m, align_m)
        # DeepGEMM's MN-major copy of the scales: each group's rows padded to a multiple of 4 (16 bytes)
        scale_rows = _align(rows, 4)
        a = rows * self.k + (rows + scale_rows) * kb * 4       # fp8 activations, their fp32 scales and the copy
        b = self.experts * (self.n * self.k + nb * kb * 4)     # fp8 weights and their fp32 scales
        d = rows * self.n * 2                                  # bf16 output
        return a + b + d + (rows * 4 if self.kind == "contiguous" else self.experts * 4)


def _align(x: int, to: int) -> int:
    return math.ceil(x / to) * to


def _rows(shape: GemmShape, m: int, align_m: int = _ALIGN_M) -> int:
    """The rows of a call's activations: ``m``, ``m`` padded to ``align_m`` (contiguous), or ``m`` padded to 64 per
    expert (masked)."""
    if shape.kind == "masked":
        return shape.experts * _align(m, _MASKED_ROWS)
    if shape.kind == "contiguous":
        return _align(m, align_m)
    return m


def m_values(max_tokens: int, n: int, mode: str | None = None, sms: int = _DEFAULT_SMS) -> tuple[int, ...]:
    """The M values to build for a layer of width ``n``, up to ``max_tokens``.

    ``full``: every M. ``relaxed``: the small Ms (1, 2, 4, then multiples of 8 up to 64), the multiples of
    DeepGEMM's block heights (64, 128, 256), the Ms at which a tiling by those heights and by block widths of 16 to
    256 fills up to 10 whole waves of the GPU's ``sms`` multiprocessors, and ``max_tokens``: where DeepGEMM's
    heuristics may pick another kernel. ``off``: none.

    Args:
        max_tokens: the largest M.
        n: the layer's output features.
        mode: ``full``, ``relaxed`` or ``off`` (default: ``BUILDOPS_DEEP_GEMM_M``).
        sms: the GPU's multiprocessors (default 132, an H100's or H200's).
    """
    mode = mode or settings.deep_gemm_m
    if mode not in _MODES:
        raise ValueError(f"m_values mode={mode!r}: expected one of {list(_MODES)} (as BUILDOPS_DEEP_GEMM_M)")
    if mode == "off" or max_tokens < 1:
        return ()
    if mode == "full":
        return tuple(range(1, max_tokens + 1))
    values = {*_SMALL_MS, max_tokens}
    for block_m in _BLOCK_MS:
        values.update(range(block_m, max_tokens + 1, block_m))
        for block_n in range(_BLOCK_N_STEP, min(_BLOCK_N_MAX, n) + 1, _BLOCK_N_STEP):
            for waves in range(1, _MAX_WAVES + 1):
                values.add(waves * sms * block_m // math.ceil(n / block_n))
    return tuple(sorted(v for v in values if 1 <= v <= max_tokens))


def find_gemm_shapes(model: nn.Module, grouped: Sequence[str] = ("contiguous",)) -> list[GemmShape]:
    """The DeepGEMM shapes of a model's FP8 weights: 2-D ones as dense ``(N, K)``, 3-D ones as ``(E, N, K)``.
    Deduplicated, in the model's order.

    Args:
        model: the model, whose parameters' shapes are read (their values need not be loaded).
        grouped: the grouped kinds each 3-D weight gets a shape of (how the model's MoE layers call DeepGEMM).
    """
    grouped = _checked_grouped(grouped, "find_gemm_shapes")
    shapes: dict[GemmShape, None] = {}
    for parameter in model.parameters():
        if parameter.dtype != torch.float8_e4m3fn:
            continue
        if parameter.dim() == 2:
            shapes[GemmShape("dense", *parameter.shape)] = None
        elif parameter.dim() == 3:
            for kind in grouped:
                shapes[GemmShape(kind, parameter.shape[1], parameter.shape[2], parameter.shape[0])] = None
    return list(shapes)


def _checked_grouped(grouped: Iterable[str], where: str) -> tuple[str, ...]:
    try:
        kinds = None if isinstance(grouped, str) else tuple(grouped)
    except TypeError:  # not iterable
        kinds = None
    if kinds is None or not all(kind in _GROUPED for kind in kinds):
        raise ValueError(f"{where}(grouped={grouped!r}): expected a tuple of {' and/or '.join(map(repr, _GROUPED))}, "
                         f"the layouts the model's MoE layers call DeepGEMM with, e.g. grouped=('masked',)")
    return kinds


def contiguous_rows(max_tokens: int, experts: int, top_k: int = 1, align_m: int = _ALIGN_M) -> int:
    """The most rows a contiguous grouped GEMM takes for ``max_tokens`` tokens: each token's ``top_k`` rows, and
    each expert's rows padded to ``align_m`` (up to ``align_m - 1`` padding rows per expert), as an engine lays them
    out for DeepGEMM (vLLM sizes its workspace so too)."""
    return _align(max_tokens * top_k + experts * (align_m - 1), align_m)


def shape_ms(shape: GemmShape, max_tokens: int, mode: str | None = None, sms: int = _DEFAULT_SMS, top_k: int = 1,
             align_m: int = _ALIGN_M) -> tuple[int, ...]:
    """The Ms a build of ``shape`` runs for up to ``max_tokens`` tokens: :func:`m_values` up to the tokens, or for a
    ``contiguous`` shape up to its :func:`contiguous_rows` (its M is the padded rows)."""
    if max_tokens < 1:
        return ()
    most = contiguous_rows(max_tokens, shape.experts, top_k, align_m) if shape.kind == "contiguous" else max_tokens
    return m_values(most, shape.n, mode, sms)


def deep_gemm_builds(shapes: Iterable[GemmShape], max_tokens: int, *, op: str = "deep_gemm",
                     device: torch.device | str | None = None, mode: str | None = None,
                     module: str = "deep_gemm", top_k: int = 1) -> list[Build]:
    """One build per distinct shape and M set: the shape's DeepGEMM entry point run at every M of the sweep.
    A ``contiguous`` shape's sweep goes up to :func:`contiguous_rows`: its M is the padded rows, not the tokens.

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
    sms = changed.get("num_sms") or device_sms(device)
    align_m = changed.get("mk_alignment_for_contiguous_layout") or _ALIGN_M
    note_module(module)
    builds: dict[tuple, Build] = {}
    for shape in shapes:
        ms = shape_ms(shape, max_tokens, mode, sms, top_k, align_m)
        if not ms:
            continue
        # The GPU's kind, not its index: the ranks of a node on GPUs of one kind need the same kernels, and one
        # key makes one of them compile them (node claims) while the others load them from the shared cache.
        key = ("deep_gemm", module, shape, ms, knobs, device_arch(device), sms)
        label = f"{KINDS[shape.kind]} E={shape.experts} N={shape.n} K={shape.k} x {len(ms)} M"
        run = _GemmRun(module, shape, ms, str(device), op, knobs)
        artifact = DeepGemmEntries(key, module, str(device), run)
        builds[key] = Build(op, key, run, uses_gpu=device.type == "cuda", label=label, library="deep_gemm",
                            artifact=artifact, abandon=run.abandon)
    return list(builds.values())


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
        self.grouped = _checked_grouped(grouped, "DeepGemmFamily")

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


@dataclass(frozen=True)
class _GemmRun:
    module: str
    shape: GemmShape
    ms: tuple[int, ...]
    device: str
    op: str
    knobs: Knobs  # engine_knobs(): set in a worker before it runs
    given_up: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    in_worker: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    entries: set[str] = field(default_factory=set, compare=False, repr=False)  # new in DeepGEMM's cache (store)
    # Set when no other build or install of this process ran beside it: its new entries are then its own compiles
    alone: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def abandon(self) -> None:
        """Given up as timed out (``Build`` contract): stop the workers if the run is stuck in one."""
        self.given_up.set()
        if self.in_worker.is_set():
            _pool.stop_workers()

    def __call__(self) -> None:
        with making_entries():
            making = entries_being_made()
            before = entry_names()
            try:
                self._run()
            finally:
                made = entry_names() - before
                self.entries.update(made)
                note_built(self.op, made)
                if making[0] == 1 and entries_being_made() == making:
                    self.alone.set()

    def _run(self) -> None:
        reserve = settings.gpu_reserve_mb  # read here: a worker process does not see this process's overrides
        if settings.executor == "threads":
            run_shape(self.module, self.shape, self.ms, self.device, reserve)
            return
        self.in_worker.set()
        try:
            _pool.run(str(self.shape), run_shape_in_worker, self.module, self.shape, self.ms, self.device, reserve,
                      self.knobs, given_up=self.given_up)
        finally:
            self.in_worker.clear()


def run_shape(module: str, shape: GemmShape, ms: Sequence[int], device: str, reserve_mb: int,
              knobs: Sequence[tuple[str, Any]] | None = None) -> int:
    """Run ``shape``'s entry point at every M (in whatever process this is); returns the number of runs.
    ``knobs``: DeepGEMM settings to set first (a worker's only, never the engine's: :mod:`.deep_gemm_knobs`)."""
    deep_gemm = importlib.import_module(module)
    entry = getattr(deep_gemm, KINDS[shape.kind])
    dev = torch.device(device)
    with on_device(dev):
        if knobs is not None:
            set_in_worker(deep_gemm, module, knobs)
        align_m = contiguous_alignment(deep_gemm)
    m_max = max(ms)
    # The contiguous kind's calls see rows, not tokens: Ms that pad to the same rows are one call.
    calls = sorted({_rows(shape, m, align_m) for m in ms}) if shape.kind == "contiguous" else list(ms)

    def make():
        return _operands(shape, m_max, dev, align_m)

    def run(operands):
        for m in calls:
            _call(entry, shape, operands, m)

    # The reserve as an argument, not a settings.scope: scopes are process-wide, and builds run side by side.
    run_admitted(dev, shape.operand_bytes(m_max, align_m), make, run, f"DeepGEMM {KINDS[shape.kind]} {shape}",
                 reserve_mb)
    return len(calls)


def run_shape_in_worker(module: str, shape: GemmShape, ms: Sequence[int], device: str, reserve_mb: int,
                        knobs: Sequence[tuple[str, Any]] = ()) -> int:
    """:func:`run_shape` in a build worker process, with DeepGEMM's settings as ``knobs`` gives them (the others
    at this worker's defaults), whose cached GPU memory then goes back to the driver. Torch keeps freed operands'
    memory cached in the process that freed them, where only that process can use it: the engine, and the gate's
    checks in the node's other processes, see what the driver has free."""
    try:
        return run_shape(module, shape, ms, device, reserve_mb, knobs)
    finally:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


def _operands(shape: GemmShape, m_max: int, device: torch.device, align_m: int) -> dict:
    fp8, kb, nb = torch.float8_e4m3fn, math.ceil(shape.k / _BLOCK), math.ceil(shape.n / _BLOCK)
    rows = _rows(shape, m_max, align_m)
    if shape.kind == "masked":
        # Each expert's rows (max_m) a multiple of 64, as engines' dispatch buffers are: DeepGEMM does not check
        # it, and its tiles then read and write across experts.
        max_m = _align(m_max, _MASKED_ROWS)
        a_shape, d_shape = (shape.experts, max_m, shape.k), (shape.experts, max_m, shape.n)
        a_scale = (shape.experts, max_m, kb)
    else:
        a_shape, d_shape, a_scale = (rows, shape.k), (rows, shape.n), (rows, kb)
    b_shape = (shape.n, shape.k) if shape.kind == "dense" else (shape.experts, shape.n, shape.k)
    b_scale = (nb, kb) if shape.kind == "dense" else (shape.experts, nb, kb)
    operands = {
        "a": torch.empty(a_shape, dtype=fp8, device=device),
        "a_scale": torch.ones(a_scale, dtype=torch.float32, device=device),  # row-major, as most engines pass it
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


def _call(entry, shape: GemmShape, o: dict, m: int) -> None:
    """One call at ``m`` tokens (``contiguous``: ``m`` rows, a multiple of the alignment)."""
    if shape.kind == "dense":
        entry((o["a"][:m], o["a_scale"][:m]), (o["b"], o["b_scale"]), o["d"][:m])
    elif shape.kind == "contiguous":
        entry((o["a"][:m], o["a_scale"][:m]), (o["b"], o["b_scale"]), o["d"][:m], o["grouped_layout"][:m])
    else:
        masked_m = torch.full((shape.experts,), m, dtype=torch.int32, device=o["a"].device)
        entry((o["a"], o["a_scale"]), (o["b"], o["b_scale"]), o["d"], masked_m, m)
