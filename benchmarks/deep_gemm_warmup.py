"""DeepGEMM's warmup for one model layer's GEMMs with the real DeepGEMM on a GPU: serial, as vLLM's
``kernel_warmup`` does it (every weight shape at every M of the sweep, one call after another in the engine's
process), against a buildops build pass (a build per kernel DeepGEMM's heuristics pick, in as many worker processes
as the builder has threads and free GPU memory holds contexts); the pass in an engine that does not start the
workers early (``cold``); the pass with DeepGEMM's NVRTC compiler (``DG_JIT_USE_NVRTC=1``) instead of nvcc; and a
second node's pass, which fetches every kernel from a build store the first pass of the round filled. Each start
runs in a fresh process with an empty ``DG_JIT_CACHE_DIR``; one with buildops, but ``cold``, calls
``buildops.startup.start_build_workers()`` first, as an engine does. A warmup is timed from after the start's
imports, its layer's weights and its CUDA context; after it, the same GEMMs at every M up to the bound (a contiguous
shape's: every aligned row count up to its padded rows) must compile nothing (new cache entries are counted as
late). A pass that did not predict DeepGEMM's kernels says why on its line: it ran every M of the sweep. The arms
take turns over ``--rounds``; medians last. A start that fails is reported with why, DeepGEMM alone having been
tried with the arm's settings, and the other arms go on.

    python3 benchmarks/deep_gemm_warmup.py [--model qwen3-30b-a3b|deepseek-v3] [--max-tokens 1024] [--top-k 8]
                                           [--mode relaxed|full] [--rounds 3] [--json PATH]
                                           [--arms serial,buildops,cold,nvrtc,second]

Needs a GPU and an importable ``deep_gemm``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# One layer's FP8 GEMMs (tensor parallel 1): dense (N, K), and MoE experts (E, N, K) in the contiguous layout.
MODELS = {
    "qwen3-30b-a3b": {  # hidden 2048, 32 q / 4 kv heads of 128, 128 experts of 768
        "dense": [(5120, 2048), (2048, 4096)],
        "experts": [(128, 1536, 2048), (128, 2048, 768)],
    },
    "deepseek-v3": {  # hidden 7168, MLA, 256 routed experts of 2048 and one shared
        "dense": [(1536, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)],
        "experts": [(256, 4096, 7168), (256, 7168, 2048)],
    },
}


def _shapes(model: str):
    from buildops.backends.deep_gemm import GemmShape

    layer = MODELS[model]
    return ([GemmShape("dense", n, k) for n, k in layer["dense"]]
            + [GemmShape("contiguous", n, k, e) for e, n, k in layer["experts"]])


def _layer(model: str, device: str):
    """A module holding one layer's FP8 weights (uninitialised), which buildops' DeepGEMM family reads."""
    import torch
    from torch import nn

    layer, fp8 = MODELS[model], torch.float8_e4m3fn
    module = nn.Module()
    module.dense = nn.ParameterList(nn.Parameter(torch.empty(n, k, dtype=fp8, device=device), requires_grad=False)
                                    for n, k in layer["dense"])
    module.experts = nn.ParameterList(nn.Parameter(torch.empty(e, n, k, dtype=fp8, device=device),
                                                   requires_grad=False) for e, n, k in layer["experts"])
    return module


def child(arm: str, model: str, max_tokens: int, mode: str, top_k: int) -> dict:
    """One start (in this process): the arm's warmup, timed, then the check at every M."""
    import torch

    from buildops.backends.deep_gemm import shape_ms
    from buildops.backends.deep_gemm.entries import entry_names
    from buildops.backends.deep_gemm.runs import copy_scales, run_shape
    from buildops.backends.deep_gemm.shapes import contiguous_rows

    shapes = _shapes(model)
    device = "cuda:0"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layer = _layer(model, device)  # the weights as an engine holds them before loading: outside the timing
    torch.empty(1, device=device)  # the CUDA context, outside the timing in all arms
    start = time.perf_counter()
    sweeps = {shape: shape_ms(shape, max_tokens, mode, sms, top_k) for shape in shapes}
    workers = runs = 0
    timeline: dict[str, Any] = {}
    if arm == "serial":
        for shape in shapes:
            runs += run_shape("deep_gemm", shape, sweeps[shape], device, 0)
        for width in sorted({-(-shape.k // 128) for shape in shapes}):  # row-major scales' copies, as engines pass
            runs += copy_scales("deep_gemm", width, device, 0)
        torch.cuda.synchronize()
        workers = 1
    else:  # what an engine does: the family finds the shapes in the model, the pass waits for their builds
        import buildops
        from buildops import build_pass, model_created, register_family
        from buildops.backends.deep_gemm import DeepGemmFamily
        from buildops.backends.deep_gemm.state import deep_gemm_state

        logging.basicConfig(level=logging.INFO)  # on the child's stderr, shown where its start fails
        not_predicted = _NotPredicted()
        logging.getLogger("buildops").addHandler(not_predicted)
        register_family(DeepGemmFamily(max_tokens=lambda config: config["max_tokens"],
                                       top_k=lambda config: config["top_k"]))
        with build_pass("warmup"):
            model_created(layer, {"max_tokens": max_tokens, "top_k": top_k})
        done = buildops.report()
        if done.total("failed"):  # the figures would time a pass that left its kernels to serving
            raise SystemExit(f"the pass failed builds:\n{done.format()}")
        here = [record for record in done.builds if record.origin != "store"]  # not fetched from the store
        runs = sum(len(getattr(record.build.run, "ms", (1,))) for record in here)
        workers = deep_gemm_state.sizing.workers if deep_gemm_state.sizing is not None else 0
        timeline = _timeline(here, start)
        if not_predicted.reasons:
            timeline["not_predicted"] = "; ".join(not_predicted.reasons)
    warmup_s = time.perf_counter() - start
    built = entry_names()
    for shape in shapes:  # every M up to the bound
        if shape.kind == "contiguous":
            rows = contiguous_rows(max_tokens, shape.experts, top_k)
            run_shape("deep_gemm", shape, range(128, rows + 1, 128), device, 0)
        else:
            run_shape("deep_gemm", shape, range(1, max_tokens + 1), device, 0)
    torch.cuda.synchronize()
    return {"arm": arm, "warmup_s": warmup_s, "kernels": len(built), "late": len(entry_names() - built),
            "runs": runs, "workers": workers, **timeline}


class _NotPredicted(logging.Handler):
    """What the pass's log says where it did not predict DeepGEMM's kernels (buildops says it once per reason, at
    INFO): such a pass runs every M of its sweep, and its figures time that fallback."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        from buildops.backends.deep_gemm.builds import NOT_PREDICTED

        said = record.getMessage()
        if said.startswith(NOT_PREDICTED):
            self.reasons.append(said.removeprefix(NOT_PREDICTED))


def _timeline(records: list, start: float) -> dict[str, Any]:
    """Where a pass's time went, from its builds' records: when the first run began and the last ended (seconds
    after the warmup's start), a run's median and longest seconds (a worker's first run includes its start), and
    each build's label, start and seconds (in ``--json``)."""
    ran = [record for record in records if record.started is not None]
    if not ran:
        return {}
    seconds = [record.seconds for record in ran]
    return {"first_run_s": min(record.started for record in ran) - start,
            "last_end_s": max(record.started + record.seconds for record in ran) - start,
            "run_median_s": statistics.median(seconds), "run_max_s": max(seconds),
            "builds": [{"label": record.build.label, "started_s": record.started - start, "seconds": record.seconds}
                       for record in sorted(ran, key=lambda record: record.started)]}


ARMS = ("serial", "buildops", "cold", "nvrtc", "second")


def _fresh_env(cache: str) -> dict[str, str]:
    """A child's environment: DeepGEMM's JIT cache in ``cache`` (empty), the repository first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "DG_JIT_CACHE_DIR": cache, "PYTHONPATH": path}


def start(arm: str, args: argparse.Namespace, store: str) -> dict:
    """One start of ``arm`` in a fresh process: its result, or ``{"arm", "error"}`` saying why it failed."""
    with tempfile.TemporaryDirectory(prefix="buildops-dg-bench-") as cache:
        env = {**_fresh_env(cache), "BUILDOPS_DEEP_GEMM_M": args.mode, **_deep_gemm_env(arm)}
        if arm in ("buildops", "second"):  # the first fills the round's store, the second fetches from it
            env["BUILDOPS_STORE"] = store
        elif arm == "cold":  # a store of its own, which it fills as the buildops arm fills the round's
            env["BUILDOPS_STORE"] = f"file://{cache}/store"
        command = [sys.executable, __file__, "--child", arm, "--model", args.model, "--max-tokens",
                   str(args.max_tokens), "--mode", args.mode, "--top-k", str(args.top_k)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            print(f"{arm} start failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return {"arm": arm, "error": probe(args.model, arm)}
        return json.loads(done.stdout.rpartition("RESULT ")[2].splitlines()[0])


def _deep_gemm_env(arm: str) -> dict[str, str]:
    """DeepGEMM's own settings of an arm: the NVRTC arm compiles with NVRTC instead of nvcc."""
    return {"DG_JIT_USE_NVRTC": "1"} if arm == "nvrtc" else {}


def _timeline_text(result: dict) -> str:
    why = f"  NOT PREDICTED: {result['not_predicted']}" if "not_predicted" in result else ""
    if "first_run_s" not in result:
        return why
    return (f"  (runs from {result['first_run_s']:.1f} s to {result['last_end_s']:.1f} s, "
            f"{result['run_median_s']:.1f} s median, {result['run_max_s']:.1f} s longest: "
            f"{max(result['builds'], key=lambda build: build['seconds'])['label']})" + why)


def probe(model: str, arm: str) -> str:
    """Whether DeepGEMM itself works here with ``arm``'s settings, for a failed start's message: one call of the
    layer's first GEMM at M=1, in a fresh process with an empty cache and without buildops (a broken install or
    compiler fails every build of a pass)."""
    call = ("from benchmarks.deep_gemm_warmup import _shapes; from buildops.backends.deep_gemm.runs import run_shape; "
            f"run_shape('deep_gemm', _shapes({model!r})[0], (1,), 'cuda:0', 0)")
    settings = "".join(f" with {name}={value}" for name, value in _deep_gemm_env(arm).items())
    with tempfile.TemporaryDirectory(prefix="buildops-dg-probe-") as cache:
        done = subprocess.run([sys.executable, "-c", call], env={**_fresh_env(cache), **_deep_gemm_env(arm)},
                              capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return f"the pass failed; DeepGEMM alone{settings} ran the layer's first GEMM in a fresh process"
    if done.returncode < 0:
        return (f"DeepGEMM alone{settings} died of {signal.Signals(-done.returncode).name} running the layer's first "
                "GEMM in a fresh process, without buildops: its install on this host is broken")
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"DeepGEMM alone{settings} failed running the layer's first GEMM, without buildops: {last}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-30b-a3b")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--top-k", type=int, default=8, help="experts per token (both models route to 8)")
    parser.add_argument("--mode", choices=("relaxed", "full"), default="relaxed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--arms", default=",".join(ARMS), help="of " + ", ".join(ARMS) + " (second needs buildops)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child not in ("serial", "cold"):  # what an engine with buildops does first, before its imports
            from buildops.startup import start_build_workers

            start_build_workers()
        result = child("buildops" if args.child in ("cold", "nvrtc", "second") else args.child, args.model,
                       args.max_tokens, args.mode, args.top_k)
        # DeepGEMM's own printf output (a warning of its compiler) is flushed at exit, after Python's: flushed first
        ctypes.CDLL(None).fflush(None)
        print("RESULT " + json.dumps({**result, "arm": args.child}), flush=True)
        return

    arms = [arm for arm in ARMS if arm in args.arms.split(",")]
    results: list[dict] = []
    for round_ in range(args.rounds):
        order = arms if round_ % 2 == 0 else [*reversed([a for a in arms if a != "second"]),
                                               *(["second"] if "second" in arms else [])]
        with tempfile.TemporaryDirectory(prefix="buildops-dg-store-") as store:
            for arm in order:
                if arm == "second" and any("error" in r for r in results if r["round"] == round_
                                           and r["arm"] == "buildops"):
                    results.append({"arm": arm, "error": "its store's pass failed", "round": round_})
                else:
                    results.append({**start(arm, args, f"file://{store}"), "round": round_})
                r = results[-1]
                print(f"round {round_} {arm:9s} " + (f"failed: {r['error']}" if "error" in r else
                      f"{r['warmup_s']:7.2f} s  {r['runs']} runs  {r['kernels']} kernels  {r['workers']} workers  "
                      f"{r['late']} late" + _timeline_text(r)), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "starts": results},
                                        indent=1))

    ran = [r for r in results if "error" not in r]
    by_round = {(r["arm"], r["round"]): r["warmup_s"] for r in ran}

    def median(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in ran if r["arm"] == arm)

    print(f"\n{args.model}: {len(_shapes(args.model))} shapes, {args.max_tokens} tokens, top-{args.top_k} "
          f"({args.mode} sweep), {args.rounds} rounds, medians")
    print(f"{'warmup':10s} {'seconds':>8s} {'runs':>6s} {'kernels':>8s} {'workers':>8s} {'late (max)':>11s}")
    for arm in arms:
        errors = [r["error"] for r in results if r["arm"] == arm and "error" in r]
        if len(errors) < args.rounds:
            late = max(r["late"] for r in ran if r["arm"] == arm)
            print(f"{arm:10s} {median(arm, 'warmup_s'):8.2f} {median(arm, 'runs'):6.0f} "
                  f"{median(arm, 'kernels'):8.0f} {median(arm, 'workers'):8.0f} {late:11d}")
        if errors:
            print(f"{arm:10s} failed in {len(errors)} of {args.rounds} rounds: {errors[-1]}")
    for arm in arms[1:] if arms[:1] == ["serial"] else []:
        ratios = [by_round["serial", n] / by_round[arm, n] for n in range(args.rounds)
                  if ("serial", n) in by_round and (arm, n) in by_round]
        if ratios:
            print(f"serial / {arm}: {statistics.median(ratios):.2f}x "
                  f"(per round {', '.join(f'{x:.2f}' for x in ratios)})")

if __name__ == "__main__":
    main()
