"""One engine start with the real DeepGEMM, in a process of its own (DeepGEMM reads ``DG_JIT_CACHE_DIR`` once per
process, at its first GEMM): a build pass over a model's FP8 weight shapes, then serving calls at token counts
inside the sweep on random data, checked against a dequantized matmul; the new cache entries and the compile
commands DeepGEMM printed in serving are counted. Prints one JSON line last.

    python3 tests/deep_gemm_child.py '{"mode": "relaxed", "max_tokens": 512, "serve_ms": [...], ...}'
"""

import ctypes
import importlib
import json
import os
import sys
import time

import torch
from torch import nn

import buildops
from buildops import build_pass, late_compiles, model_created, register_family, report
from buildops.backends.deep_gemm import DeepGemmFamily, find_gemm_shapes
from buildops.backends.deep_gemm.entries import entry_names

FP8 = torch.float8_e4m3fn


class Layer(nn.Module):
    """A model's FP8 weights, as an engine holds them before they are loaded."""

    def __init__(self, dense, experts):
        super().__init__()
        self.dense = nn.ParameterList(nn.Parameter(torch.empty(n, k, dtype=FP8, device="cuda"), requires_grad=False)
                                      for n, k in dense)
        self.experts = nn.ParameterList(nn.Parameter(torch.empty(e, n, k, dtype=FP8, device="cuda"),
                                                     requires_grad=False) for e, n, k in experts)


def per_token(x):
    """bf16 ``[.., m, k]`` to fp8 with fp32 scales ``[.., m, k/128]`` (DeepGEMM's activation recipe)."""
    *lead, m, k = x.shape
    v = x.float().view(*lead, m, k // 128, 128)
    sf = v.abs().amax(-1).clamp(1e-4) / 448.0
    return (v / sf.unsqueeze(-1)).to(FP8).view(*lead, m, k), sf


def per_block(x):
    """bf16 ``[.., n, k]`` to fp8 with fp32 scales ``[.., n/128, k/128]`` (its weight recipe)."""
    *lead, n, k = x.shape
    v = x.float().view(*lead, n // 128, 128, k // 128, 128)
    sf = v.abs().amax(dim=(-3, -1)).clamp(1e-4) / 448.0
    return (v / sf[..., :, None, :, None]).to(FP8).view(*lead, n, k), sf


def dequantized(q, sf, rows_per_scale):
    *lead, r, k = q.shape
    scale = sf.repeat_interleave(rows_per_scale, dim=-2)[..., :r, :].repeat_interleave(128, dim=-1)
    return q.float() * scale


def difference(x, y):
    """DeepGEMM's own measure: 1 - 2<x,y> / (|x|^2 + |y|^2)."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum().clamp_min(1e-12))


def serve(dg, kind, e, n, k, m):
    """One serving call of ``kind`` at ``m`` tokens on random data; returns its difference from the reference."""
    b, b_sf = per_block(torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16))
    if kind == "dense":
        a = per_token(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        dg.fp8_gemm_nt(a, (b[0], b_sf[0]), d)
        return difference(d, dequantized(*a, 1) @ dequantized(b[0], b_sf[0], 128).T)
    if kind == "masked":  # each expert's rows in a buffer of a multiple of 64 rows, as a dispatch buffer is
        max_m = -(-m // 64) * 64
        a = per_token(torch.randn(e, max_m, k, device="cuda", dtype=torch.bfloat16))
        d = torch.empty(e, max_m, n, device="cuda", dtype=torch.bfloat16)
        masked_m = torch.randint(1, m + 1, (e,), device="cuda", dtype=torch.int32)
        dg.m_grouped_fp8_gemm_nt_masked(a, (b, b_sf), d, masked_m, m)
        ref = dequantized(*a, 1) @ dequantized(b, b_sf, 128).transpose(1, 2)
        return max(difference(d[i, :int(masked_m[i])], ref[i, :int(masked_m[i])]) for i in range(e))
    # contiguous: m tokens routed to the experts, each expert's rows padded to the alignment, padding marked -1
    align = dg.get_mk_alignment_for_contiguous_layout()
    counts = torch.bincount(torch.randint(0, e, (m,)), minlength=e).tolist()
    padded = [-(-c // align) * align for c in counts]
    rows = sum(padded)
    x = torch.zeros(rows, k, device="cuda", dtype=torch.bfloat16)
    layout = torch.full((rows,), -1, device="cuda", dtype=torch.int32)
    start = 0
    for expert, (count, size) in enumerate(zip(counts, padded)):
        x[start:start + count] = torch.randn(count, k, device="cuda", dtype=torch.bfloat16)
        layout[start:start + count] = expert
        start += size
    a = per_token(x)
    d = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    dg.m_grouped_fp8_gemm_nt_contiguous(a, (b, b_sf), d, layout)
    ref, weights, start, worst = dequantized(*a, 1), dequantized(b, b_sf, 128), 0, 0.0
    for expert, (count, size) in enumerate(zip(counts, padded)):
        if count:
            worst = max(worst, difference(d[start:start + count], ref[start:start + count] @ weights[expert].T))
        start += size
    return worst


def every_m(dg, shape, max_tokens):
    """Each M a serving call of ``shape`` may have up to ``max_tokens`` tokens (a contiguous shape's: each multiple
    of the alignment up to its padded rows), on operands of zeros with row-major activation scales."""
    from buildops.backends.deep_gemm import contiguous_rows

    kb, nb, e = -(-shape.k // 128), -(-shape.n // 128), shape.experts
    align = dg.get_mk_alignment_for_contiguous_layout()
    top = contiguous_rows(max_tokens, e, 1, align) if shape.kind == "contiguous" else max_tokens
    rows = top if shape.kind != "masked" else -(-top // 64) * 64
    lead = (e,) if shape.kind == "masked" else ()
    a = torch.zeros(*lead, rows, shape.k, device="cuda").to(FP8)
    a_sf = torch.ones(*lead, rows, kb, device="cuda")
    b = torch.zeros(e, shape.n, shape.k, device="cuda").to(FP8)
    b_sf = torch.ones(e, nb, kb, device="cuda")
    d = torch.empty(*lead, rows, shape.n, device="cuda", dtype=torch.bfloat16)
    if shape.kind == "dense":
        for m in range(1, top + 1):
            dg.fp8_gemm_nt((a[:m], a_sf[:m]), (b[0], b_sf[0]), d[:m])
    elif shape.kind == "masked":
        for m in range(1, top + 1):
            dg.m_grouped_fp8_gemm_nt_masked((a, a_sf), (b, b_sf), d, torch.full((e,), m, device="cuda",
                                                                               dtype=torch.int32), m)
    else:
        layout = torch.arange(rows, device="cuda", dtype=torch.int32) // align % e
        for m in range(align, top + 1, align):
            dg.m_grouped_fp8_gemm_nt_contiguous((a[:m], a_sf[:m]), (b, b_sf), d[:m], layout[:m])
    torch.cuda.synchronize()


def main():
    spec = json.loads(sys.argv[1])
    dg = importlib.import_module("deep_gemm")

    grouped = tuple(spec.get("grouped", ("contiguous", "masked")))
    model = Layer([tuple(s) for s in spec["dense"]], [tuple(s) for s in spec["experts"]])
    register_family(DeepGemmFamily(max_tokens=lambda config: config["max_tokens"], grouped=grouped))
    shapes = find_gemm_shapes(model, grouped)

    start = time.perf_counter()
    with build_pass("warmup"):
        model_created(model, {"max_tokens": spec["max_tokens"]})
    pass_s = time.perf_counter() - start
    built_entries = entry_names()

    # From here DeepGEMM prints each compile's command on this process's stdout (read on every compile); the build
    # workers were started without it.
    os.environ["DG_JIT_PRINT_COMPILER_COMMAND"] = "1"
    torch.manual_seed(0)
    worst = 0.0
    for shape in shapes:
        for m in spec["serve_ms"]:
            worst = max(worst, serve(dg, shape.kind, shape.experts, shape.n, shape.k, m))
    torch.cuda.synchronize()
    ctypes.CDLL(None).fflush(None)
    if spec.get("every_m"):
        # DeepGEMM prints the configuration it picks for each new call on stdout, which the test compares with
        # buildops' reproduction of its choice.
        os.environ["DG_PRINT_CONFIGS"] = "1"
        for shape in shapes:
            every_m(dg, shape, spec["max_tokens"])
        del os.environ["DG_PRINT_CONFIGS"]
        ctypes.CDLL(None).fflush(None)
    served_entries = entry_names()
    late_in_sweep = [late.describe() for late in late_compiles()]

    # A shape no pass listed: DeepGEMM compiles it on first use, which buildops reports as late.
    outside = spec.get("outside")
    if outside:
        serve(dg, "dense", 1, outside[0], outside[1], 64)
        torch.cuda.synchronize()
        ctypes.CDLL(None).fflush(None)
    sys.stdout.flush()
    print("\nRESULT " + json.dumps({
        "pass_s": pass_s, "shapes": [str(s) for s in shapes], "built": report().total("built"),
        "failed": report().total("failed"), "entries_after_pass": sorted(built_entries),
        "new_in_serving": sorted(served_entries - built_entries), "worst_difference": worst,
        "late_in_sweep": late_in_sweep, "late_after_outside": [late.describe() for late in late_compiles()],
        "new_after_outside": sorted(entry_names() - served_entries), "pid": os.getpid(),
        "buildops": buildops.__file__}), flush=True)


if __name__ == "__main__":
    main()
