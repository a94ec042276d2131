"""Kernel libraries with a dispatch layer of their own, started lazily and with buildops, side by side.

Each library serves a small model of 4 blocks made of its ops, decorated from outside (one ``@lists_kernels`` on
the block), through a trace of requests at row counts the start never saw:

    dispatch  tests/dispatch_library.py: launch caches that keep the compiled kernel and read the tuner's
              best_config back, an aten override (torch.nn.functional.silu), a tuner keyed on the exact row count
    unsloth   unsloth's own launch cache (unsloth/kernels/triton_launch.py, loaded from its installed files), which
              relaunches the kept kernel with compiled.run(...), around an RMSNorm kernel of this script's
    flashnn   flashnn 0.1.1's fused MoE (8 experts, top 2), whose launch cache keeps the first kernel a config's
              constexprs meet and relaunches it with kernel[grid](...); needs Triton 3.8 or newer (the relaunch
              passes no constexprs, which older launchers need)
    fla       fla-core 0.6.0's RMSNorm and SwiGLU (examples/fla_lm's library: it calls Triton plainly, through
              @triton.autotune), for comparison

and two starts of each, every one a fresh process with an empty Triton cache:

    lazy      no buildops: every kernel compiles, and every tuning runs, in the first request that needs it
    buildops  the startup recipe (``rehearse_then_load``) with buildops' defaults: a rehearsal at the largest shape

Times are from the start of the engine's start (after imports): ready, the first request's end, the trace's end.
Every start finds Python's bytecode cached (an untimed start of each primes it).
Counted on the serving thread during the trace: compiles and tunings; and the tunings buildops deferred (queued,
run on its serial worker). Outputs are compared with the lazy start's of the same round.

    python3 benchmarks/libraries.py [--rounds 3] [--libraries dispatch,unsloth,flashnn,fla]

Run from the repository root on a GPU machine (unsloth, flashnn and fla-core installed, or their wheels on
PYTHONPATH). A line per start, then a table of medians, last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Bytecode for every start, primed by an untimed start of each: a host whose site-packages lack it (the GPU host's)
# would otherwise compile what each start imports from source, and a replay imports more of torch than a lazy run.
PYCACHE = pathlib.Path(tempfile.gettempdir()) / "buildops-libraries-pycache"
TRACE = (100, 1, 2048, 37, 4096, 513)  # rows of each request: tokens of a batch, flattened
DUMMY_ROWS = 4096  # the rehearsal's: the most rows a request has
WIDTH, BLOCKS = 1024, 4


# -- the child: one start ---------------------------------------------------------------------------------------

def _dispatch_model():
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "tests"))
    import dispatch_library as L

    L.register("CUDA")

    def block(x, w):
        h = F.silu(L.rms_norm(x, w))
        return x + L.softmax_tuned(L.softmax(h, -1), -1)

    return block


def _unsloth_model():
    import torch
    import triton
    import triton.language as tl

    spec = importlib.util.find_spec("unsloth")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "kernels" / "triton_launch.py"
    module_spec = importlib.util.spec_from_file_location("unsloth_triton_launch", path)
    launcher = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(launcher)

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, EPS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        out = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + EPS)) * w
        tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)

    def block(x, w):
        out = torch.empty_like(x)
        # unsloth's launch takes tensors, then ints, then constexprs in the kernel's order
        launcher.launch(rms_norm_kernel, (x.shape[0],), (x, w, out, x.shape[1]), 3,
                        {"EPS": 1e-6, "BLOCK": triton.next_power_of_2(x.shape[1])}, torch.cuda.current_device(),
                        num_warps=4)
        return x + torch.sigmoid(out)

    return block


def _flashnn_model():
    import torch
    from flashnn.triton_kernels.fused_moe_fp16 import fused_moe_fp16_forward

    experts, top_k, config = 8, 2, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    block_m = config["BLOCK_SIZE_M"]
    generator = torch.Generator("cuda").manual_seed(1)
    router = torch.randn(WIDTH, experts, device="cuda", dtype=torch.float16, generator=generator)
    expert_weights = torch.randn(experts, WIDTH, WIDTH, device="cuda", dtype=torch.float16, generator=generator) * 0.03

    def align(topk_ids):
        """Token slots sorted by expert, each expert's run padded to a whole block (an engine's moe_align), with no
        host sync: the padded length is the most it can be, tokens * top_k + experts * (block_m - 1)."""
        flat = topk_ids.flatten()
        slots = flat.numel()
        counts = torch.zeros(experts, dtype=torch.int64, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + block_m - 1) // block_m * block_m
        ends = padded.cumsum(0)
        order = torch.argsort(flat, stable=True)
        expert_of = flat[order]
        rank = torch.arange(slots, device=flat.device) - (counts.cumsum(0) - counts)[expert_of]
        rows = slots + experts * (block_m - 1)
        sorted_ids = torch.full((rows,), slots, dtype=torch.int32, device=flat.device)
        sorted_ids[(ends - padded)[expert_of] + rank] = order.to(torch.int32)
        block_starts = torch.arange(0, rows, block_m, device=flat.device)
        expert_ids = torch.searchsorted(ends, block_starts, right=True).clamp_(max=experts - 1).to(torch.int32)
        return sorted_ids, expert_ids, ends[-1:].to(torch.int32)

    def block(x, w):
        h = (x * w).half()
        weights, ids = torch.topk(torch.softmax((h @ router).float(), -1), top_k)
        ids = ids.to(torch.int32)
        sorted_ids, expert_ids, post_padded = align(ids.long())
        out = torch.empty(x.shape[0], top_k, WIDTH, device=x.device, dtype=torch.float16)
        fused_moe_fp16_forward(h, expert_weights, out, weights, ids, sorted_ids, expert_ids, post_padded, True, top_k,
                               config)
        return x + out.sum(1).to(x.dtype)

    return block


def _fla_model():
    from fla.modules.activations import swiglu
    from fla.modules.norm.layernorm import rms_norm

    def block(x, w):
        h = rms_norm(x, w, None, eps=1e-6)
        return x + swiglu(h, h)

    return block


def child(library: str, how: str) -> dict:
    if how == "buildops":  # first thing, as the startup recipe says: the workers start beside the imports
        from buildops.startup import start_build_workers

        start_build_workers()
    import torch
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    serving = threading.main_thread()
    counts = {"compiles": 0, "tunings": 0}
    counting = [False]
    previous = knobs.runtime.jit_post_compile_hook

    def count_compile(**kwargs):
        if counting[0] and threading.current_thread() is serving:
            counts["compiles"] += 1
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = count_compile
    prune = Autotuner.prune_configs  # called once per tuning, just before its timings

    def count_tuning(self, *args, **kwargs):
        if counting[0] and threading.current_thread() is serving:
            counts["tunings"] += 1
        return prune(self, *args, **kwargs)

    Autotuner.prune_configs = count_tuning
    block = {"dispatch": _dispatch_model, "unsloth": _unsloth_model, "flashnn": _flashnn_model,
             "fla": _fla_model}[library]()
    if how == "buildops":
        from buildops import BuildConfig, DynamicSpec, lists_kernels

        block = lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep="pow2")), output="x")(block)
    torch.manual_seed(0)
    weights = [torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16) for _ in range(BLOCKS)]

    def forward(x):
        for w in weights:
            x = block(x, w)
        return x

    begin = time.perf_counter()
    if how == "buildops":
        from buildops.startup import rehearse_then_load

        rehearse_then_load(lambda: forward(torch.zeros(DUMMY_ROWS, WIDTH, device="cuda", dtype=torch.bfloat16)),
                           lambda: None)
    ready = time.perf_counter() - begin
    sums, ends = [], []
    counting[0] = True
    for rows in TRACE:
        x = torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda")
                        .manual_seed(rows))
        sums.append(forward(x).float().sum().item())  # .item() waits for the GPU
        ends.append(time.perf_counter() - begin)
    counting[0] = False
    deferred, steps = 0, ""
    if how == "buildops":
        import buildops
        from buildops.startup import phases

        deferred = sum(late.kind == "tuning" for late in buildops.late_compiles())
        steps = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases())
        print(buildops.report().format(), file=sys.stderr)
        buildops.shutdown()  # the tunings nobody waited for: those queued are dropped, a running one ends
    return {"library": library, "start": how, "ready_s": ready, "first_s": ends[0], "end_s": ends[-1],
            "compiles": counts["compiles"], "tunings": counts["tunings"], "deferred": deferred, "sums": sums,
            "steps": steps}


# -- the parent ---------------------------------------------------------------------------------------------------

def start(library: str, how: str, work: pathlib.Path, show: bool = True) -> dict:
    cache = tempfile.mkdtemp(prefix=f"triton-{library}-{how}-", dir=work)
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(path), PYTHONPYCACHEPREFIX=str(PYCACHE),
               BUILDOPS_NODE_LOCKS=str(pathlib.Path(cache) / "locks"))
    env.pop("BUILDOPS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the cache above must fill
    done = subprocess.run([sys.executable, __file__, "--child", library, how], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{library} {how} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not show:
        return result
    print(f"{library:9} {how:9} ready {result['ready_s']:6.2f} s  first {result['first_s']:6.2f} s  end "
          f"{result['end_s']:6.2f} s  compiles {result['compiles']:3}  tunings {result['tunings']:3}  deferred "
          f"{result['deferred']:3}{'  (' + result['steps'] + ')' if result['steps'] else ''}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--libraries", default="dispatch,unsloth")
    parser.add_argument("--child", nargs=2, metavar=("LIBRARY", "START"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    libraries = args.libraries.split(",")
    results: dict[tuple[str, str], list[dict]] = {}
    diffs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="buildops-libraries-") as work:
        for library in libraries:  # untimed: every start then finds the bytecode of what it imports
            for how in ("lazy", "buildops"):
                start(library, how, pathlib.Path(work), show=False)
        for _ in range(args.rounds):
            for library in libraries:
                lazy, ours = (start(library, how, pathlib.Path(work)) for how in ("lazy", "buildops"))
                for result in (lazy, ours):
                    results.setdefault((library, result["start"]), []).append(result)
                diffs.setdefault(library, []).append(max(abs(a - b) / max(abs(a), 1.0)
                                                         for a, b in zip(lazy["sums"], ours["sums"])))
    print(f"\nmedians of {args.rounds} round(s); first request and trace end against the lazy start's")
    print("library    start     ready s  first s  end s   first/lazy  end/lazy  compiles  tunings  deferred  "
          "output diff")
    for library in libraries:
        lazy = results[(library, "lazy")]
        for how in ("lazy", "buildops"):
            runs = results[(library, how)]

            def median(field, of=runs):
                return statistics.median(r[field] for r in of)

            first_ratio = statistics.median(r["first_s"] / base["first_s"] for r, base in zip(runs, lazy))
            end_ratio = statistics.median(r["end_s"] / base["end_s"] for r, base in zip(runs, lazy))
            diff = f"{max(diffs[library]):.1e}" if how == "buildops" else "-"
            print(f"{library:10} {how:9} {median('ready_s'):7.2f}  {median('first_s'):7.2f}  {median('end_s'):5.2f}  "
                  f"{first_ratio:10.2f}  {end_ratio:8.2f}  {max(r['compiles'] for r in runs):8}  "
                  f"{max(r['tunings'] for r in runs):7}  {max(r['deferred'] for r in runs):8}  {diff:>11}")


if __name__ == "__main__":
    main()
