"""DeepGEMM's internals that buildops reads, kept here so that a new DeepGEMM changes one place.
Checked against 2.6.1 (deepseek-ai/DeepGEMM, built from source on the GPU host); the CPU tests run a fake that
mirrors it (``tests/fake_deep_gemm.py``).

* The entry points a build runs, by shape kind (``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_contiguous``,
  ``m_grouped_fp8_gemm_nt_masked``: in 2.6 aliases of the ``fp8_fp4`` functions), and every public function that
  may compile a kernel (:data:`ENTRY_POINTS`; a module that lacks one is not watched for it).
* What its operands must be: FP8 scales per block of 128 along N and K, each expert's rows in the masked layout a
  multiple of 64, and the copy of the activations' scales that a call makes (MN-major, each group's rows padded
  to a multiple of 4) unless they are so already, with its own kernel per scales' width (``SCALES_COPY``).
* Which kernel its heuristics pick for a call, in :mod:`.heuristics` (the versions and architectures checked
  there); and what a cache entry's kernel was made of, read from the code DeepGEMM generated for it
  (:func:`entry_kernel`), which tells which entry is a build's own.
* Its heuristics' block shapes, which the relaxed M sweep covers (``csrc/jit_kernels/heuristics/sm90.hpp``): block
  heights 64, 128 and 256 (and 16 or 32 for the smallest Ms), block widths multiples of 16 up to 256 (up to 192 or
  160 for some kernels: the sweep covers more than it needs).
* How its entry points take their operands (:func:`call`).
* Its process-global settings, read and set by name: ``get_``/``set_`` ``num_sms``, ``tc_util`` and
  ``mk_alignment_for_contiguous_layout``; ``set_ignore_compile_dims`` and ``set_block_size_multiple_of`` have no
  getter in 2.6, so they are taken only where a DeepGEMM has one. Defaults: all the GPU's multiprocessors,
  ``tc_util`` 100, an alignment of 128 (``kLegacyMKAlignmentForContiguousLayout``).
* Its disk cache (the C++ compiler's, ``csrc/jit/compiler.hpp``): ``DG_JIT_CACHE_DIR``, else ``$HOME/.deep_gemm``;
  each kernel in ``cache/kernel.<name>.<hash>/`` with ``kernel.cu`` and ``kernel.cubin`` (an entry lacking either
  aborts the process), compiled in ``tmp/<uuid>`` and renamed into place. The hash covers the kernel's code, the
  compiler's signature (nvcc's version) and its flags, among them ``-I<package>/include`` and the ``DG_JIT_*``
  settings.
* Its compiler: nvcc is ``DG_JIT_NVCC_COMPILER``, else ``<CUDA home>/bin/nvcc``, with the CUDA home found as its
  ``_find_cuda_home`` finds it (``CUDA_HOME``, ``CUDA_PATH``, the nvcc on ``PATH``, ``/usr/local/cuda``).
* Its version: the installed distribution's, else the module's ``__version__`` (2.6.1 sets it in ``__init__``),
  read from its source where it is not imported.

This module imports neither DeepGEMM nor torch (its package imports torch): the modules are named, and read where
a caller has imported them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ALIGNMENT_KNOB", "BLOCK", "BLOCK_MS", "BLOCK_N_MAX", "BLOCK_N_STEP", "CACHE_DIR_ENV", "DEFAULT_ALIGNMENT",
           "ENTRY_FILES", "ENTRY_POINTS", "GEMM_ARGUMENTS", "GEMM_TEMPLATE", "GEMM_TYPES", "KERNEL_NAMES", "KINDS",
           "KNOBS", "KNOB_DEFAULTS", "MAJOR_K", "MASKED_ROWS", "PLAIN_EPILOGUE", "SCALES_ARGUMENTS", "SCALES_COPY",
           "SCALES_TEMPLATE", "SCALE_ROWS_ALIGNMENT", "SMS_KNOB", "UNREAD_KNOB", "cache_root", "call",
           "compile_settings", "contiguous_alignment", "cuda_home", "entries_dir", "entry_kernel", "include_dir",
           "is_entry", "kernel_name", "knob_getters", "library_version", "nvcc", "set_knob", "staging_dir"]

KINDS = {
    "dense": "fp8_gemm_nt",
    "contiguous": "m_grouped_fp8_gemm_nt_contiguous",
    "masked": "m_grouped_fp8_gemm_nt_masked",
}
"""The entry point a build runs for each shape kind."""

ENTRY_POINTS = (
    "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "fp8_gemm_nt_skip_head_mid",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
    "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "bf16_m_grouped_gemm_nt_masked", "k_grouped_bf16_gemm_tn_contiguous",
    "einsum", "fp8_einsum", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits",
    "fp8_mqa_logits", "fp8_paged_mqa_logits", "tf32_hc_prenorm_gemm", "fp8_fp4_mega_moe", "bf16_mega_moe",
    "transform_sf_into_required_layout", "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor", "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
)
"""DeepGEMM's public functions that may compile a kernel (those a module has are watched)."""

BLOCK = 128               # the scaling block along N and K
MASKED_ROWS = 64          # what each expert's rows in the masked layout must be a multiple of
SCALE_ROWS_ALIGNMENT = 4  # each group's rows of a call's MN-major copy of the activations' scales: 16 bytes
SCALES_COPY = "get_mn_major_tma_aligned_tensor"  # that copy, a kernel per scales' width (``transpose_fp32``)

# The heuristics' block shapes (the relaxed M sweep covers the Ms where their tilings change)
BLOCK_MS = (64, 128, 256)           # block heights
BLOCK_N_STEP, BLOCK_N_MAX = 16, 256  # block widths: multiples of 16 up to 256

# -- calling an entry point -----------------------------------------------------------------------------------------

def call(entry: Callable[..., Any], kind: str, operands: dict[str, Any], m: int, masked_m: Any = None) -> None:
    """One call of ``kind``'s entry point (:data:`KINDS`) at ``m`` tokens, as DeepGEMM takes its operands: the
    activations and the weights each as a pair (FP8 data, its scales), the BF16 output, then the kind's own
    arguments (``contiguous``: the rows' expert layout, ``m`` rows, a multiple of the alignment; ``masked``: the
    rows each expert uses, ``masked_m``, and the expected ``m``). ``operands``: ``a``, ``a_scale``, ``b``,
    ``b_scale``, ``d`` and, for ``contiguous``, ``grouped_layout``, each as large as the largest call's."""
    o = operands
    if kind == "dense":
        entry((o["a"][:m], o["a_scale"][:m]), (o["b"], o["b_scale"]), o["d"][:m])
    elif kind == "contiguous":
        entry((o["a"][:m], o["a_scale"][:m]), (o["b"], o["b_scale"]), o["d"][:m], o["grouped_layout"][:m])
    else:
        entry((o["a"], o["a_scale"]), (o["b"], o["b_scale"]), o["d"], masked_m, m)


# -- process-global settings ---------------------------------------------------------------------------------------

SMS_KNOB = "num_sms"  # the multiprocessors its kernels are tiled for
ALIGNMENT_KNOB = "mk_alignment_for_contiguous_layout"  # each expert's rows in the contiguous layout

KNOBS = {
    SMS_KNOB: ("get_num_sms", "set_num_sms"),
    "tc_util": ("get_tc_util", "set_tc_util"),
    ALIGNMENT_KNOB: ("get_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout"),
    "ignore_compile_dims": ("get_ignore_compile_dims", "set_ignore_compile_dims"),
    "block_size_multiple_of": ("get_block_size_multiple_of", "set_block_size_multiple_of"),
}
"""The settings that change the kernels DeepGEMM picks: ``(getter, setter)`` by name."""

UNREAD_KNOB = "block_size_multiple_of"  # changes DeepGEMM's block widths; not in its reproduced heuristics

DEFAULT_ALIGNMENT = 128  # the alignment of each expert's rows in the contiguous layout, by default

KNOB_DEFAULTS: dict[str, Any] = {"tc_util": 100, ALIGNMENT_KNOB: DEFAULT_ALIGNMENT}
"""The settings' defaults, where they are fixed (``num_sms``'s is the GPU's multiprocessors)."""


def knob_getters(module: Any) -> dict[str, Callable[[], Any]]:
    """The getters of the settings ``module`` can both read and set, by setting."""
    return {name: getattr(module, getter) for name, (getter, setter) in KNOBS.items()
            if callable(getattr(module, getter, None)) and callable(getattr(module, setter, None))}


def set_knob(module: Any, name: str, value: Any) -> None:
    """Set ``module``'s setting ``name`` to ``value``."""
    getattr(module, KNOBS[name][1])(value)


def contiguous_alignment(module: Any) -> int:
    """The alignment of each expert's rows in the contiguous layout now in force."""
    getter: Any = getattr(module, KNOBS[ALIGNMENT_KNOB][0], None)
    return int(getter()) if getter is not None else DEFAULT_ALIGNMENT


# -- the disk cache ------------------------------------------------------------------------------------------------

CACHE_DIR_ENV = "DG_JIT_CACHE_DIR"

ENTRY_FILES = ("kernel.cu", "kernel.cubin")
"""What an entry must hold: DeepGEMM aborts the process on an entry directory that lacks either."""

_ENTRY_PREFIX = "kernel."


def cache_root() -> Path:
    """DeepGEMM's cache directory, as its compiler picks it: ``DG_JIT_CACHE_DIR``, else ``$HOME/.deep_gemm`` (with
    ``HOME`` unset, ``.deep_gemm`` in the working directory)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path(os.environ.get("HOME", "")) / ".deep_gemm")


def entries_dir(root: Path | None = None) -> Path:
    """The directory of the kernel entries under ``root`` (default: :func:`cache_root`)."""
    return (cache_root() if root is None else root) / "cache"


def staging_dir(root: Path) -> Path:
    """Where an entry is made whole before it is renamed into :func:`entries_dir`."""
    return root / "tmp"


def is_entry(name: str) -> bool:
    """Whether ``name`` in :func:`entries_dir` is a kernel's entry (``kernel.<name>.<hash>``)."""
    return name.startswith(_ENTRY_PREFIX)


def kernel_name(entry: str) -> str:
    """The kernel an entry holds: ``<name>`` of ``kernel.<name>.<hash>``."""
    return entry[len(_ENTRY_PREFIX):].rpartition(".")[0]


# What DeepGEMM's generated code (``generate_impl`` of its runtimes, in kernel.cu) instantiates, and the template's
# arguments by position: the SM90 FP8 GEMMs' (``sm90_fp8_gemm_1d2d.hpp``) and the scales' copy's (``smxx_layout.hpp``)
GEMM_TEMPLATE = "sm90_fp8_gemm_1d2d_impl"
GEMM_ARGUMENTS = ("major_sfb", "m", "n", "k", "groups", "block_m", "block_n", "block_k", "swizzle_a", "swizzle_b",
                  "swizzle_cd", "stages", "tma_threads", "math_threads", "cluster_size", "multicast_on_a", "sms",
                  "gemm_type", "cd_dtype", "epilogue")
SCALES_TEMPLATE = "transpose_fp32"
SCALES_ARGUMENTS = ("threads", "block_mn", "sf_k")
GEMM_TYPES = {"dense": "GemmType::Normal", "contiguous": "GemmType::MGroupedContiguous",
              "masked": "GemmType::MGroupedMasked"}
MAJOR_K = "cute::UMMA::Major::K"  # the weights' scales K-major, as buildops' builds and engines pass them
PLAIN_EPILOGUE = "epilogue::transform::EpilogueIdentity"  # the GEMM entry points' (not fp8_gemm_nt_skip_head_mid's)
KERNEL_NAMES = {"dense": "sm90_fp8_gemm_1d2d", "contiguous": "sm90_m_grouped_fp8_gemm_contiguous_1d2d",
                "masked": "sm90_fp8_m_grouped_gemm_masked_1d2d", "scales": "transpose_fp32"}  # the entries' names
_INSTANTIATION = re.compile(r"&(\w+)<(.*?)>\);", re.S)


def entry_kernel(entry: Path) -> dict[str, str] | None:
    """What the kernel in cache entry ``entry`` was made of, read from its ``kernel.cu``: ``template`` and its
    arguments by name (:data:`GEMM_ARGUMENTS`, :data:`SCALES_ARGUMENTS`), as text; None for another kernel or code
    this version of the reading does not know."""
    try:
        found = _INSTANTIATION.search((entry / "kernel.cu").read_text(errors="replace"))
    except OSError:
        return None
    if found is None:
        return None
    template, values = found[1], [value.strip() for value in found[2].split(",")]
    names = {GEMM_TEMPLATE: GEMM_ARGUMENTS, SCALES_TEMPLATE: SCALES_ARGUMENTS}.get(template)
    if names is None or len(values) < len(names):
        return None
    return {"template": template, **dict(zip(names, values))}


def compile_settings() -> list[tuple[str, str]]:
    """The ``DG_*`` environment variables set now, which may change what compiles (the cache's place does not)."""
    return sorted((k, v) for k, v in os.environ.items() if k.startswith("DG_") and k != CACHE_DIR_ENV)


# -- its compiler, its install -------------------------------------------------------------------------------------

def cuda_home() -> str:
    """The CUDA home DeepGEMM's ``_find_cuda_home`` finds: the environment, then the nvcc on PATH, then the usual
    place."""
    found = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if found:
        return found
    nvcc_path = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(nvcc_path)) if nvcc_path else "/usr/local/cuda"


def nvcc() -> str:
    """The nvcc DeepGEMM's compiler runs."""
    return os.environ.get("DG_JIT_NVCC_COMPILER") or str(Path(cuda_home()) / "bin" / "nvcc")


def library_version(module: str) -> str:
    """The version of the DeepGEMM installed as ``module``: its distribution's, else its ``__version__``, read from
    its source where this process has not imported it (an engine's pass may come first; the workers import it, and
    whether its choice of kernel is predicted must not depend on which came first)."""
    from importlib import metadata

    for name in (module, module.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    loaded = sys.modules.get(module)
    if loaded is not None:
        return str(getattr(loaded, "__version__", "unknown"))
    source = _source_file(module)
    if source is None:
        return "unknown"
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return "unknown"
    found = re.search(r"""^__version__\s*=\s*(['"])([^'"]+)\1""", text, re.MULTILINE)  # the line its setup.py reads
    return found[2] if found else "unknown"


def include_dir(module: str) -> str:
    """DeepGEMM's ``-I`` path, as its hash sees it (``<package>/include``), found without importing it."""
    path = _source_file(module)
    return str(Path(os.path.abspath(path)).parent / "include") if path else "no include dir"


def _source_file(module: str) -> str | None:
    """The file ``module`` is (or would be) imported from (a package's ``__init__.py``), found without importing it."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if path is not None:
        return path
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.has_location else None
