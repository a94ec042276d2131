"""An engine's start and first requests on a GPU, in a process of its own (FlashInfer reads its workspace,
FLASHINFER_WORKSPACE_BASE, when it is imported; the test gives it an empty one): one build pass replays the
prefill and decode wrappers' plans through the engine's op family, then the engine plans and runs a prefill and a
decode batch for real. Prints a JSON summary: what the pass built and how long it took, what compiled while
serving, and the outputs' distance from a plain-torch reference."""

import json
import time
from pathlib import Path

import flashinfer.jit.core
import flashinfer.jit.env
import torch

import buildops
from buildops import build_pass, model_created, register_family, report

from paged_attention import DECODE, PREFILL, AttentionConfig, AttentionPlans, PagedAttention, random_batch, reference

WORKSPACE = flashinfer.jit.env.FLASHINFER_WORKSPACE_DIR


def compiled_files() -> dict[str, int]:
    """Every object and library in FlashInfer's workspace, with its mtime."""
    return {str(p.relative_to(WORKSPACE)): p.stat().st_mtime_ns for p in WORKSPACE.rglob("*")
            if p.suffix in (".so", ".o")}


# FlashInfer has no hook for its ninja runs: count them at the name its JitSpec.build calls.
ninja_runs: list[str] = []
run_ninja = flashinfer.jit.core.run_ninja


def counted_run_ninja(workdir, *args, **kwargs):
    ninja_runs.append(Path(workdir).name)
    return run_ninja(workdir, *args, **kwargs)


flashinfer.jit.core.run_ninja = counted_run_ninja


def serve(engine: PagedAttention, requests, plan, wrapper, seed: int) -> float:
    """Plan and run one batch as the engine serves it; the largest distance of its output from the reference."""
    batch, q, cache = random_batch(requests, engine.config, seed)
    plan(batch)
    out = wrapper.run(q.cuda(), cache.cuda())
    return (out.float().cpu() - reference(q, cache, batch)).abs().max().item()


config = AttentionConfig()
engine = PagedAttention(config, "cuda")
register_family(AttentionPlans())
empty = compiled_files()
started = time.perf_counter()
with build_pass("startup"):
    model_created(engine, config)
pass_seconds = time.perf_counter() - started
built, ninja_in_pass = compiled_files(), len(ninja_runs)

errors = {"prefill": serve(engine, PREFILL, engine.plan_prefill, engine.prefill, seed=1),
          "decode": serve(engine, DECODE, engine.plan_decode, engine.decode, seed=2)}
torch.cuda.synchronize()
after = compiled_files()
print(json.dumps({
    "buildops": buildops.__file__,
    "workspace": str(WORKSPACE),
    "workspace_was_empty": empty == {},
    "pass_seconds": pass_seconds,
    "libraries": sorted(Path(path).name for path in built if path.endswith(".so")),
    "ninja": {"pass": ninja_in_pass, "serving": ninja_runs[ninja_in_pass:]},
    "changed_while_serving": sorted(path for path in built.keys() | after.keys() if built.get(path) != after.get(path)),
    "late": [late.describe() for late in buildops.late_compiles()],
    "report": report().to_dict(),
    "errors": errors,
}), flush=True)
