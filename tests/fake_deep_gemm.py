"""A stand-in for ``deep_gemm`` (deepseek-ai/DeepGEMM 2.6 on an SM90 GPU) with its public signatures.

It checks its operands as DeepGEMM's SM90 FP8 kernels assert them (a failed check raises ``RuntimeError``, as
DeepGEMM's do) and appends one line per call to the file named by ``FAKE_DEEP_GEMM_LOG`` (so that calls made in
worker processes are seen), optionally holding the GIL for ``FAKE_DEEP_GEMM_GIL_SECONDS`` like DeepGEMM's binding,
which never releases it.

With ``DG_JIT_CACHE_DIR`` set, it keeps a cache laid out as DeepGEMM's is: a call whose kernel has no
``cache/kernel.<name>.<hash>/`` entry "compiles" one (made in ``tmp/`` and renamed into place, with ``kernel.cu``
and ``kernel.cubin``; ``kernel.cu`` holds the configuration as JSON after ``// config: ``). Kernels carry DeepGEMM's
SM90 names, and their hash covers the tiling DeepGEMM's SM90 heuristics pick (buildops' reproduction of them,
checked against the real library's choices), without the raw M: as in DeepGEMM, many Ms share one kernel. A
row-major (not MN-major, TMA-aligned) fp32 SFA also needs a ``transpose_fp32`` kernel per ``ceil(K / 128)``. An
entry without both files makes a call fail, as DeepGEMM aborts.
"""

import ctypes
import hashlib
import json
import math
import os
import shutil
import uuid
from pathlib import Path

import torch

from buildops.backends.deep_gemm.heuristics import Tiling, stages, tiling

__version__ = "2.6.1"  # the DeepGEMM this fake stands for

_libc = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL, like a C++ binding that never releases it

_DEVICE_SMS = 132  # the multiprocessors of the GPU this fake pretends to be (an H100's or H200's)
_DEFAULT_RECIPE = (1, 128, 128)

# DeepGEMM's process-global settings; 0 means "the default" for num_sms and tc_util, as in DeepGEMM.
_knobs = {"num_sms": 0, "tc_util": 0, "mk_alignment": 128}


def _require(condition, what):
    if not condition:
        raise RuntimeError(f"Assertion error (fake_deep_gemm): {what}")


def set_num_sms(new_num_sms):
    _require(0 <= new_num_sms <= _DEVICE_SMS, f"num_sms {new_num_sms} not in [0, {_DEVICE_SMS}]")
    _knobs["num_sms"] = new_num_sms


def get_num_sms():
    return _knobs["num_sms"] or _DEVICE_SMS


def set_tc_util(new_tc_util):
    _require(0 <= new_tc_util <= 100, f"tc_util {new_tc_util} not in [0, 100]")
    _knobs["tc_util"] = new_tc_util


def get_tc_util():
    return _knobs["tc_util"] or 100


def set_mk_alignment_for_contiguous_layout(new_value):
    _knobs["mk_alignment"] = new_value


def get_mk_alignment_for_contiguous_layout():
    return _knobs["mk_alignment"]


# -- the cache -------------------------------------------------------------------------------------------------

def _compile(name, fields):
    """The entry of this kernel, and whether this call compiled it (None: no cache, nothing compiles)."""
    root = os.environ.get("DG_JIT_CACHE_DIR")
    if not root:
        return None, None
    digest = hashlib.sha256(json.dumps([name, sorted(fields.items())]).encode()).hexdigest()[:32]
    entry = f"kernel.{name}.{digest}"
    final = Path(root) / "cache" / entry
    if final.exists():
        _require((final / "kernel.cu").is_file() and (final / "kernel.cubin").is_file(),
                 f"Corrupted JIT cache directory {final}, please run rm -rf")
        return entry, False
    staging = Path(root) / "tmp" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    (staging / "kernel.cu").write_text(f"// config: {json.dumps({'kernel': name, **fields})}\n{_code(fields)}")
    (staging / "kernel.cubin").write_bytes(b"\x7fELF" + digest.encode())
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, final)
    except OSError:  # another process made it meanwhile
        shutil.rmtree(staging)
        return entry, False
    return entry, True


def _code(fields):
    """The kernel's code as DeepGEMM 2.6 generates it (``generate_impl`` of its runtimes): the template it
    instantiates and its arguments (the ones that do not enter the fake's configuration at stand-in values)."""
    if "sf_k" in fields:
        template, args = "transpose_fp32", [fields["num_threads"], fields["block_mn"], fields["sf_k"]]
    else:
        cluster_m, cluster_n = fields["cluster"]
        compiled = fields["compiled_dims"]
        template = "sm90_fp8_gemm_1d2d_impl"
        args = ["cute::UMMA::Major::K", fields.get("m", 0), fields["n"] if "n" in compiled else 0,
                fields["k"] if "k" in compiled else 0, fields["groups"], fields["block_m"], fields["block_n"], 128,
                128, 128, 64, stages(Tiling(fields["block_m"], fields["block_n"], cluster_m, cluster_n), fields["k"]),
                128, 128 if fields["block_m"] <= 64 else 256, cluster_m * cluster_n,
                "true" if cluster_n > 1 else "false", fields["num_sms"], f"GemmType::{fields['gemm_type']}",
                "cutlass::bfloat16_t", "epilogue::transform::EpilogueIdentity"]
    lines = ",\n        ".join(map(str, args))
    return ("// Includes' hash value: 0\n#include <deep_gemm/impls/fake.cuh>\n\nusing namespace deep_gemm;\n\n"
            f"static void __instantiate_kernel() {{\n    auto ptr = reinterpret_cast<void*>(&{template}<\n"
            f"        {lines}\n    >);\n}};\n")


def _record(fn, kernels, **fields):
    """Log one call; ``kernels`` are (name, config) pairs of what it needs, compiled where missing."""
    seconds = float(os.environ.get("FAKE_DEEP_GEMM_GIL_SECONDS", "0"))
    if seconds:
        _libc.usleep(int(seconds * 1e6))
    entries, compiled = [], []
    for name, config in kernels:
        entry, made = _compile(name, config)
        entries.append(entry)
        compiled.append(made)
    fields["entries"] = entries
    cached = bool(os.environ.get("DG_JIT_CACHE_DIR"))
    fields["compiled"] = [e for e, made in zip(entries, compiled) if made] if cached else None
    log = os.environ.get("FAKE_DEEP_GEMM_LOG")
    if log:
        with open(log, "a") as out:
            out.write(json.dumps({"fn": fn, "pid": os.getpid(), **fields}) + "\n")


def _gemm_config(kind, n, k, groups, compiled_dims, m, expected_m=None):
    # What DeepGEMM's kernel code depends on, less the details: M enters only through the tiling its heuristics
    # pick (for the expected M where a call gives one), unless compiled_dims names it.
    picked = tiling(kind, expected_m or m, n, k, groups, get_num_sms(), get_mk_alignment_for_contiguous_layout())
    config = {"gemm_type": {"dense": "Normal", "contiguous": "MGroupedContiguous", "masked": "MGroupedMasked"}[kind],
              "n": n, "k": k, "groups": groups, "block_m": picked.block_m, "block_n": picked.block_n,
              "cluster": [picked.cluster_m, picked.cluster_n], "num_sms": get_num_sms(), "tc_util": get_tc_util(),
              "compiled_dims": compiled_dims}
    if "m" in compiled_dims:
        config["m"] = m
    return config


# -- the checks --------------------------------------------------------------------------------------------------

def _pair(x, what):
    _require(isinstance(x, (tuple, list)) and len(x) == 2, f"{what} must be a (tensor, scale) pair")
    return x


def _major_check(t, what):
    _require(t.dim() in (2, 3), f"{what} must have 2 or 3 dimensions")
    if t.dim() == 3:
        _require(t.stride(0) == t.size(-2) * t.size(-1), f"{what}: groups must be packed")
    _require(t.stride(-2) == 1 or t.stride(-1) == 1, f"{what} must be K-major or MN-major")


def _k_major_fp8(t, dims, what):
    _major_check(t, what)
    _require(t.stride(-1) == 1, f"{what} must be K-major on SM90")
    _require(t.dtype == torch.float8_e4m3fn, f"{what} must be fp8 (e4m3)")
    _require(t.dim() == dims, f"{what} must have {dims} dimensions")


def _output(d, dims, dtypes):
    _major_check(d, "d")
    _require(d.stride(-1) == 1, "d must be N-major")
    _require(d.dim() == dims, f"d must have {dims} dimensions")
    _require(d.dtype in dtypes, f"d must be {' or '.join(map(str, dtypes))}")


def _recipe(recipe, recipe_a, recipe_b, sfa, sfb):
    """(gran_m, gran_n, gran_k), as DeepGEMM resolves it on SM90."""
    if recipe is None and recipe_a is None:
        _require(sfa.dtype == torch.float32 and sfb.dtype == torch.float32, "SM90 scales must be fp32")
        recipe = _DEFAULT_RECIPE
    _require((recipe_a is None) == (recipe_b is None), "recipe_a and recipe_b go together")
    _require((recipe_a is None) != (recipe is None), "give either recipe or recipe_a and recipe_b")
    gran_m, gran_n, gran_k = recipe if recipe is not None else (recipe_a[0], recipe_b[0], recipe_a[1])
    _require(recipe is not None or recipe_a[1] == recipe_b[1], "one K granularity")
    _require(gran_m == 1 and gran_k == 128 and gran_n in (1, 128), f"recipe {recipe} not supported on SM90")
    return gran_m, gran_n, gran_k


def _scales(sf, mn, k, gran_mn, gran_k, groups, what):
    """Check a scale tensor as DeepGEMM does; the transpose kernel it needs, if any (DeepGEMM turns a per-row
    fp32 scale into an MN-major, TMA-aligned copy, with a JIT kernel when the input is contiguous)."""
    _require(sf.dtype == torch.float32, f"{what} must be fp32 on SM90")
    _require(sf.dim() == 2 + (groups is not None), f"{what} has {sf.dim()} dimensions")
    if groups is not None:
        _require(sf.size(-3) == groups, f"{what} must have {groups} groups")
    _require(sf.size(-2) == math.ceil(mn / gran_mn), f"{what} must have {math.ceil(mn / gran_mn)} rows")
    _require(sf.size(-1) == math.ceil(k / gran_k), f"{what} must have {math.ceil(k / gran_k)} columns")
    if gran_mn == 128:  # SM90 SFB: contiguous, or contiguous after transposing its last two dimensions
        if groups is not None:
            _require(sf.stride(-3) == sf.size(-2) * sf.size(-1), f"{what}: groups must be packed")
        _require((sf.stride(-1) == 1 and sf.stride(-2) == sf.size(-1)) or
                 (sf.stride(-1) == sf.size(-2) and sf.stride(-2) == 1), f"{what} must be contiguous")
        return []
    batched = sf if sf.dim() == 3 else sf.unsqueeze(0)
    aligned_mn, sf_k = math.ceil(mn / 4) * 4, sf.size(-1)
    if ((sf.dim() == 2 or batched.stride(0) == aligned_mn * sf_k) and batched.stride(1) == 1
            and batched.stride(2) == aligned_mn):
        return []  # already MN-major and TMA-aligned
    return [("transpose_fp32", {"num_threads": 512, "block_mn": 64, "sf_k": sf_k})] if sf.is_contiguous() else []


def _int32_vector(t, numel, what):
    _require(t.dtype == torch.int32, f"{what} must be int32")
    _require(t.is_contiguous(), f"{what} must be contiguous")
    _require(t.dim() == 1 and t.numel() == numel, f"{what} must have shape ({numel},)")


def _contiguous_layout(grouped_layout, groups, alignment):
    """The rule DeepGEMM's contiguous kernels rely on: each row's expert, or -1 for a padding row, and each
    expert's run of rows starting at a multiple of the alignment (its block height)."""
    values = grouped_layout.tolist()
    _require(all(-1 <= v < groups for v in values), f"grouped_layout values must be in [-1, {groups})")
    for row, value in enumerate(values):
        if value >= 0 and (row == 0 or values[row - 1] != value):
            _require(row % alignment == 0, f"expert {value}'s rows start at {row}, not a multiple of {alignment}")


# -- the entry points --------------------------------------------------------------------------------------------

def fp8_fp4_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                    disable_ue8m0_cast=False):
    (a, sfa), (b, sfb) = _pair(a, "a"), _pair(b, "b")
    _k_major_fp8(a, 2, "a")
    _k_major_fp8(b, 2, "b")
    _output(d, 2, (torch.bfloat16, torch.float32))
    (m, k), n = a.shape, b.shape[0]
    _require(b.shape[1] == k and tuple(d.shape) == (m, n), "shapes must be [M, K] @ [N, K].T -> [M, N]")
    if c is not None:
        _require(c.dtype == d.dtype and c.stride(-1) == 1, "c must be N-major with d's dtype")
    if m == 0 or n == 0 or k == 0:  # nothing to compute: DeepGEMM returns before compiling anything
        if m and n:
            d.copy_(c) if c is not None else d.zero_()
        _record("fp8_fp4_gemm_nt", [], m=m, n=n, k=k)
        return
    gran_m, gran_n, gran_k = _recipe(recipe, recipe_a, recipe_b, sfa, sfb)
    kernels = _scales(sfa, m, k, gran_m, gran_k, None, "SFA") + _scales(sfb, n, k, gran_n, gran_k, None, "SFB")
    if gran_n == 1:
        kernel = "sm90_fp8_gemm_1d1d"
    else:
        _require(d.dtype == torch.bfloat16 and c is None, "the 1D2D kernel writes bf16 and does not accumulate")
        kernel = "sm90_fp8_gemm_1d2d"
    kernels.append((kernel, _gemm_config("dense", n, k, 1, compiled_dims, m)))
    _record("fp8_fp4_gemm_nt", kernels, m=m, n=n, k=k)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                                         ensure_zero_padding=True, expected_m_for_psum_layout=None):
    (a, sfa), (b, sfb) = _pair(a, "a"), _pair(b, "b")
    _k_major_fp8(a, 2, "a")
    _k_major_fp8(b, 3, "b")
    _require(grouped_layout.is_contiguous(), "grouped_layout must be contiguous")
    (m, k), (groups, n, _) = a.shape, b.shape
    _require(b.shape[2] == k and tuple(d.shape) == (m, n), "shapes must be [M, K] @ [G, N, K].mT -> [M, N]")
    _require(n > 0 and k > 0 and groups > 0, "N, K and G must be positive")
    _output(d, 2, (torch.bfloat16,))
    if use_psum_layout:
        _int32_vector(grouped_layout, groups, "grouped_layout")
    else:
        _int32_vector(grouped_layout, m, "grouped_layout")
        _require(expected_m_for_psum_layout is None, "expected_m_for_psum_layout goes with use_psum_layout")
    if m == 0:  # DeepGEMM returns before compiling anything
        _record("m_grouped_fp8_fp4_gemm_nt_contiguous", [], m=m, n=n, k=k, e=groups)
        return
    alignment = get_mk_alignment_for_contiguous_layout()
    if not use_psum_layout:
        _contiguous_layout(grouped_layout, groups, alignment)
    gran_m, gran_n, gran_k = _recipe(recipe, recipe_a, recipe_b, sfa, sfb)
    _require(gran_n == 128, "SM90 grouped GEMMs take 128 x 128 weight scales")
    kernels = _scales(sfa, m, k, gran_m, gran_k, None, "SFA") + _scales(sfb, n, k, gran_n, gran_k, groups, "SFB")
    kernels.append(("sm90_m_grouped_fp8_gemm_contiguous_1d2d",
                    _gemm_config("contiguous", n, k, groups, compiled_dims, m)))
    _record("m_grouped_fp8_fp4_gemm_nt_contiguous", kernels, m=m, n=n, k=k, e=groups)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False):
    (a, sfa), (b, sfb) = _pair(a, "a"), _pair(b, "b")
    _k_major_fp8(a, 3, "a")
    _k_major_fp8(b, 3, "b")
    _require(masked_m.is_contiguous(), "masked_m must be contiguous")
    (groups, m, k), n = a.shape, b.shape[1]
    _require(b.shape[0] == groups and b.shape[2] == k and tuple(d.shape) == (groups, m, n),
             "shapes must be [G, M, K] @ [G, N, K].mT -> [G, M, N]")
    _int32_vector(masked_m, groups, "masked_m")
    _require(isinstance(expected_m, int) and expected_m > 0 and m > 0 and n > 0 and k > 0,
             "expected_m, M, N and K must be positive")
    _output(d, 3, (torch.bfloat16,))
    gran_m, gran_n, gran_k = _recipe(recipe, recipe_a, recipe_b, sfa, sfb)
    _require(gran_n == 128, "SM90 grouped GEMMs take 128 x 128 weight scales")
    kernels = _scales(sfa, m, k, gran_m, gran_k, groups, "SFA") + _scales(sfb, n, k, gran_n, gran_k, groups, "SFB")
    kernels.append(("sm90_fp8_m_grouped_gemm_masked_1d2d",
                    _gemm_config("masked", n, k, groups, compiled_dims, m, expected_m)))
    _record("m_grouped_fp8_fp4_gemm_nt_masked", kernels, m=expected_m, max_m=m, n=n, k=k, e=groups)


def get_mn_major_tma_aligned_tensor(sf):
    """The scales MN-major, each group's rows padded to a multiple of 4 (TMA-aligned); a copy made by a
    ``transpose_fp32`` kernel where ``sf`` is contiguous and not so already."""
    _require(sf.dtype == torch.float32 and sf.dim() in (2, 3), "sf must be a 2-D or 3-D fp32 tensor")
    mn, sf_k = sf.shape[-2:]
    kernels = _scales(sf, mn, sf_k * 128, 1, 128, sf.size(0) if sf.dim() == 3 else None, "sf")
    _record("get_mn_major_tma_aligned_tensor", kernels, mn=mn, sf_k=sf_k)
    if not kernels and not sf.is_contiguous():
        return sf
    aligned = math.ceil(mn / 4) * 4
    out = torch.empty((*sf.shape[:-2], sf_k, aligned), dtype=sf.dtype, device=sf.device).transpose(-1, -2)
    out = out[..., :mn, :]
    out.copy_(sf)
    return out


# The names DeepGEMM binds to the same functions.
fp8_gemm_nt = fp8_fp4_gemm_nt
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
