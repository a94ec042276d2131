"""Start a transformers model made of fla-core's Triton ops (``examples/hf_fla``) four ways and serve a trace:

    lazy      no buildops: load, serve; every kernel compiles (and autotunes) in the first request needing it
    warmup    no buildops: load, then a forward per supported shape, one compile after another (vLLM's way)
    buildops  the startup recipe, buildops' defaults (worker processes on 8 CPUs or more)
    threads   the same with BUILDOPS_EXECUTOR=threads

each with the checkpoint's load (2.8 GB of random weights in safetensors, read from disk: its pages are dropped
from the page cache first) and without it (dummy weights), each start a fresh process with an empty Triton cache.
``--rounds N`` runs every start N times, interleaved (round 1 of every arm, then round 2, ...). Each start serves
the same seeded trace (24 requests of batch 1-8, prompts 1-2048 tokens, 2-6 new tokens each), then replays it warm:
a request's stall is its time less its warm time.

    python3 benchmarks/real_start.py [--rounds 3] [--arms lazy,warmup,buildops,threads] [--load both|on|off]

Run from the repository root on a GPU machine. A line per start as it ends, then a table of medians, last. Times
are from the process's launch: ready to serve, the first request's end, the trace's end. ``--budget`` seconds
(default 470) stops starting runs that would not end within it (judged by that arm's last run), and still prints
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup import PYCACHE, drop_from_page_cache  # this script's folder is on sys.path; it imports no torch

ROOT = Path(__file__).resolve().parents[1]

ARMS = {  # name: (the example's --start, environment)
    "lazy": ("lazy", {"BUILDOPS": "0"}),
    "warmup": ("warmup", {"BUILDOPS": "0"}),
    "buildops": ("buildops", {}),
    "threads": ("buildops", {"BUILDOPS_EXECUTOR": "threads"}),
}
INHERITED_OUT = ("BUILDOPS", "BUILDOPS_EXECUTOR")  # the arms set these; "buildops" is the defaults


def child_env(work: Path, name: str, env: dict[str, str]) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in INHERITED_OUT}
    # The repository first, and whatever the caller's PYTHONPATH brings (fla-core on a host where it is carried).
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    # Every cache a start could fill its own: Triton's (fla's autotuning results go there too), inductor's.
    environ.update(PYTHONPATH=os.pathsep.join(path), PYTHONPYCACHEPREFIX=str(PYCACHE),
                   TRITON_CACHE_DIR=str(work / f"triton-{name}"),
                   TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor-{name}"),
                   BUILDOPS_NODE_LOCKS=str(work / f"locks-{name}"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    environ.update(env)
    return environ


def run_child(args: list[str], environ: dict[str, str], log: Path, timeout: float) -> tuple[int, str]:
    """Run the example; its exit status and stdout. Its stderr goes to ``log``. Stopped, with every process it
    started (build workers), if it runs past ``timeout``."""
    with open(log, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "examples.hf_fla", *args], cwd=ROOT, env=environ,
                                   stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            return -signal.SIGKILL, out
    return process.returncode, out


def start(arm: str, load: bool, round_: int, example: list[str], checkpoint: Path, work: Path,
          timeout: float) -> dict | None:
    how, env = ARMS[arm]
    name = f"{arm}-{'load' if load else 'noload'}-{round_}"
    args = ["--start", how, *example]
    if not load:
        args.append("--no-load")
    else:
        drop_from_page_cache(checkpoint)
    log = work / f"{name}.log"
    spawned = time.time()
    code, out = run_child(args, child_env(work, name, env), log, timeout)
    lines = out.strip().splitlines()
    if code != 0 or not lines:
        tail = log.read_text(errors="replace")[-1500:]
        print(f"  {name} FAILED (exit {code}); end of {log}:\n{tail}", flush=True)
        return None
    result = json.loads(lines[-1])
    for key in ("imported", "ready", "first_done", "trace_end"):
        result[f"{key}_s"] = result[key] - spawned
    result["wall_s"] = time.time() - spawned
    return result


def line(arm: str, load: bool, round_: int, r: dict) -> str:
    late = "-" if r["late_compiles"] is None else r["late_compiles"]
    failed = "" if not r.get("build_failures") else f", {r['build_failures']} builds FAILED"
    return (f"round {round_} {'load' if load else 'no load'} {arm}: ready {r['ready_s']:.1f} s, first request "
            f"{r['first_done_s']:.1f} s, trace end {r['trace_end_s']:.1f} s, stall longest {r['longest_stall_s']:.2f} "
            f"s / total {r['total_stall_s']:.2f} s, compiles in serving {r['serving_compiles']}, late {late}"
            f"{failed} (load {r['load_s']:.1f} s, imports {r['imported_s']:.1f} s, wall {r['wall_s']:.0f} s)")


COLUMNS = [("ready s", "ready_s", "{:.2f}"), ("first request s", "first_done_s", "{:.2f}"),
           ("trace end s", "trace_end_s", "{:.2f}"), ("longest stall s", "longest_stall_s", "{:.2f}"),
           ("total stall s", "total_stall_s", "{:.2f}"), ("compiles in serving", "serving_compiles", "{:g}"),
           ("late compiles", "late_compiles", "{:g}"), ("load s", "load_s", "{:.2f}")]


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(results: dict[tuple[bool, str], list[dict]], arms: list[str], loads: list[bool]) -> list[str]:
    rows = ["| load | start | runs | " + " | ".join(title for title, _, _ in COLUMNS) + " |",
            "| --- | --- | ---: | " + " | ".join("---:" for _ in COLUMNS) + " |"]
    for load in loads:
        for arm in arms:
            runs = results.get((load, arm), [])
            cells = []
            for _, key, form in COLUMNS:
                value = median(runs, key)
                cells.append("" if value is None else form.format(value))
            rows.append(f"| {'yes' if load else 'no'} | {arm} | {len(runs)} | " + " | ".join(cells) + " |")
    return rows


def goals(results: dict[tuple[bool, str], list[dict]], loads: list[bool]) -> list[str]:
    """The issue's goals, on the medians: buildops' defaults <= lazy on the first request, < lazy on the trace's
    end, and nothing compiled while serving."""
    out = []
    for load in loads:
        lazy, ours = results.get((load, "lazy")), results.get((load, "buildops"))
        if not lazy or not ours:
            continue
        first = (median(ours, "first_done_s"), median(lazy, "first_done_s"))
        end = (median(ours, "trace_end_s"), median(lazy, "trace_end_s"))
        compiles = max(r["serving_compiles"] + (r["late_compiles"] or 0) for r in ours)
        out.append(f"{'with' if load else 'without'} the load: first request buildops {first[0]:.2f} s vs lazy "
                   f"{first[1]:.2f} s ({'met' if first[0] <= first[1] else 'NOT met'}); trace end {end[0]:.2f} s vs "
                   f"{end[1]:.2f} s ({'met' if end[0] < end[1] else 'NOT met'}); compiles in serving, most in a "
                   f"run: {compiles} ({'met' if compiles == 0 else 'NOT met'})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--load", choices=("both", "on", "off"), default="both")
    parser.add_argument("--size", default="base", help="the example's model size (base, large, small)")
    parser.add_argument("--requests", type=int, default=24, help="requests in the trace")
    parser.add_argument("--timeout", type=float, default=240, help="seconds one start may take")
    parser.add_argument("--budget", type=float, default=470, help="seconds the whole run may take")
    parser.add_argument("--example-args", default="", help="more arguments for the example (e.g. '--device cpu "
                        "--reference-ops': the whole run without a GPU, to check the benchmark itself)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"--arms: unknown {sorted(unknown)}; known: {', '.join(ARMS)}")
    loads = {"both": [False, True], "on": [True], "off": [False]}[args.load]
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="buildops-real-start-"))
    checkpoint = Path(tempfile.gettempdir()) / "buildops-hf-fla" / f"{args.size}.safetensors"

    prepare = ["--size", args.size, "--checkpoint", str(checkpoint), *args.example_args.split()]
    example = [*prepare, "--requests", str(args.requests)]
    prepare += ["--start", "lazy"]  # no build workers for making the checkpoint and priming the bytecode
    if True in loads and not checkpoint.exists():
        code, _ = run_child([*prepare, "--make-checkpoint"], child_env(work, "make", {"BUILDOPS": "0"}),
                            work / "make.log", 600)
        if code != 0:
            raise SystemExit(f"making the checkpoint failed:\n{(work / 'make.log').read_text()[-3000:]}")
        print(f"made {checkpoint} ({checkpoint.stat().st_size / 1e9:.2f} GB) in {time.monotonic() - began:.0f} s")
    # Bytecode for every start, primed once (nothing of it is timed), as benchmarks/startup.py does.
    run_child([*prepare, "--imports-only"], child_env(work, "prime", {"BUILDOPS": "0"}), work / "prime.log", 600)

    results: dict[tuple[bool, str], list[dict]] = {}
    last_wall: dict[tuple[bool, str], float] = {}
    stopped = False
    for round_ in range(1, args.rounds + 1):
        for load in loads:
            for arm in arms:
                expected = last_wall.get((load, arm), 0.0)
                if time.monotonic() - began + expected > args.budget:
                    stopped = True
                    break
                r = start(arm, load, round_, example, checkpoint, work, args.timeout)
                if r is None:
                    continue
                last_wall[(load, arm)] = r["wall_s"]
                results.setdefault((load, arm), []).append(r)
                print(line(arm, load, round_, r), flush=True)
            if stopped:
                break
        if stopped:
            print(f"stopped in round {round_}: the next start would end past --budget {args.budget:.0f} s")
            break

    tokens = {r["tokens"] for load in loads for arm in arms for r in results.get((load, arm), []) if load}
    print(f"\n{args.size} model, {args.requests} requests; logs in {work}; {time.monotonic() - began:.0f} s in all; "
          f"tokens of the loaded starts {'identical' if len(tokens) <= 1 else f'in {len(tokens)} variants'}")
    for goal in goals(results, loads):
        print(goal)
    print("\nmedians over rounds (seconds from each process's launch):\n")
    print("\n".join(table(results, arms, loads)))


if __name__ == "__main__":
    main()
