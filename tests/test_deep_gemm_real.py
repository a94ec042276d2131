"""The real DeepGEMM on a GPU (marker ``gpu``; skipped without CUDA or without ``deep_gemm``): a build pass in
worker processes, through the memory gate, then serving calls at token counts inside the sweep that compile
nothing and match a dequantized matmul. Each start runs in a process of its own, with an empty JIT cache."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("deep_gemm") is None, reason="needs DeepGEMM (not on the registry)"),
]

CHILD = Path(__file__).with_name("deep_gemm_child.py")
# What DeepGEMM prints of each new call's configuration with DG_PRINT_CONFIGS=1 (GemmType: 0 dense, 1 contiguous,
# 2 masked)
PRINTED = re.compile(r"GemmDesc\(gemm_type=(\d), .*?m=(\d+), n=(\d+), k=(\d+), num_groups=(\d+), .*?num_sms=(\d+), "
                     r".*?expected_m=(\d+), .*?\): GemmConfig\(layout=Layout\(swap_ab=0, block_m=(\d+), "
                     r"block_n=(\d+), block_k=\d+, cluster_m=(\d+), cluster_n=(\d+)\)")
# One layer's weights, small enough for a test: 2 dense projections and an MoE's 2 expert weights.
LAYER = {"dense": [[1536, 1024], [1024, 768]], "experts": [[8, 768, 1024], [8, 1024, 384]]}


def _start(tmp_path, **spec):
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(tmp_path / "dg-cache"), BUILDOPS_DEEP_GEMM_M=spec.pop("mode"))
    env.pop("DG_JIT_PRINT_COMPILER_COMMAND", None)
    done = subprocess.run([sys.executable, str(CHILD), json.dumps({**LAYER, **spec})], env=env, capture_output=True,
                          text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    before, _, result = done.stdout.rpartition("\nRESULT ")
    return json.loads(result), before


@pytest.mark.parametrize("mode, max_tokens", [("relaxed", 1024), ("full", 160)])
def test_after_a_pass_the_real_deep_gemm_serves_inside_the_sweep_compiling_nothing(tmp_path, mode, max_tokens):
    serve_ms = sorted({1, 3, 17, 64, 100, max_tokens // 3, max_tokens - 1, max_tokens})
    result, printed = _start(tmp_path, mode=mode, max_tokens=max_tokens, serve_ms=serve_ms, outside=[2560, 1024],
                             every_m=True)
    # 2 dense, 2 x 2 grouped: a build per kernel DeepGEMM's heuristics pick, and per width of the scales' copy
    assert result["failed"] == 0 and len(result["shapes"]) == 6 and result["built"] > 6
    names = {entry.split(".")[1] for entry in result["entries_after_pass"]}
    assert {"sm90_fp8_gemm_1d2d", "sm90_m_grouped_fp8_gemm_contiguous_1d2d",
            "sm90_fp8_m_grouped_gemm_masked_1d2d"} <= names
    # Serving at random Ms inside the sweep, then at every M up to the bound: no new entry and no late compile (and
    # below: no compile command printed but the unlisted shape's).
    assert result["new_in_serving"] == [] and result["late_in_sweep"] == []
    assert result["worst_difference"] < 1e-3
    # A shape no pass listed compiles on first use, and buildops reports it as DeepGEMM's late compile.
    assert result["new_after_outside"], "the unlisted shape compiled nothing?"
    assert printed.count("Running NVCC command") == len(result["new_after_outside"])
    late = result["late_after_outside"]
    assert late and all("deep_gemm" in line for line in late)


def test_the_real_deep_gemm_picks_the_kernels_buildops_predicts(tmp_path):
    """At every M of a dense, a contiguous and a masked shape, the configuration DeepGEMM printed for the call is
    the tiling buildops' reproduction of its heuristics predicts."""
    from buildops.backends.deep_gemm.heuristics import Tiling, tiling

    result, printed = _start(tmp_path, mode="relaxed", max_tokens=600, serve_ms=[1], every_m=True)
    kinds = {"0": "dense", "1": "contiguous", "2": "masked"}
    seen = 0
    for found in PRINTED.finditer(printed):
        gemm_type, m, n, k, groups, sms, expected_m, *chosen = found.groups()
        kind = kinds[gemm_type]
        heuristic_m = int(expected_m) if kind != "dense" else int(m)
        assert tiling(kind, heuristic_m, int(n), int(k), int(groups), int(sms)) == Tiling(*map(int, chosen)), found[0]
        seen += 1
    assert seen > 600 and result["new_in_serving"] == []
