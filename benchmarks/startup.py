"""Startup of examples/tiny_llm: time from launch to ready-to-serve, and first-request latency, started

    (a) lazy      load, then serve: kernels compile (and autotune) in the first requests
    (b) warmup    load, then the warmup forwards for real, one compile after another
    (c) buildops  rehearsal overlapped with the load (the load begins beside the rehearsal)
    (d) buildops  again, with the Triton cache (c) left: a restart
    and (c) with the load begun once the rehearsal is done (``rehearse_then_load(..., overlap=False)``)

each in a fresh process with an empty Triton cache (except (d)), reading the checkpoint from disk (its pages are
dropped from the page cache before each start), in one run. Every start finds Python bytecode cached (see
PYCACHE). A serial build ((c) with one builder thread and no worker processes) gives the build time the goal
divides by the cores. With ``--ranks 2`` (a machine
with 2 GPUs) it also starts 2 ranks of (c) at once on one node, sharing the Triton cache, with and without
buildops' node locks, and reports the node's CPU seconds and the time until both are ready. With ``--rounds N``
it starts (a), (c) and (d) N times, one after another in turn, and judges the goal on each round and on the
medians: the load's time moves by a second from start to start on a shared host, more than the goal's 10%.

With ``--store`` it also starts (c) with a build store (a directory) that it fills, then (s) a start with an empty
Triton cache that fetches every kernel from that store: a new replica of a cluster whose store is warm.

    python3 benchmarks/startup.py [--size base] [--ranks 2] [--variants] [--rounds 5] [--store]

Run from the repository root. The checkpoint is made once, before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Bytecode for every start, primed once. A profile of a start on the GPU host found 945 source compiles (3.4 s)
# in torch's imports: its site-packages seemed to lack bytecode. The imports still took 3.5-3.9 s with this cache,
# so it may not be the cause; it is kept because it costs nothing and every start gets it alike.
PYCACHE = Path(tempfile.gettempdir()) / "buildops-startup-pycache"
# Every buildops start here leaves out the example's warm request, which moves work from the first request into the
# start: the starts stay those docs/benchmarks.md's table records, and benchmarks/first_request.py weighs the warm
# request.
NO_WARM = ("--no-warm-request",)


def start(how: str, size: str, checkpoint: Path, cache: Path, work: Path, env: dict | None = None,
          device: str | None = None, extra: tuple = (), entry: tuple = ("-m", "examples.tiny_llm")) -> subprocess.Popen:
    """Start the example in a fresh process (``entry``: what follows the interpreter on its command line, another
    script that runs the example's main will do); :func:`finish` waits for it and reads what it wrote."""
    out = work / f"{how}-{time.monotonic_ns()}.json"
    environ = dict(os.environ, TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(PYCACHE),
                   BUILDOPS_NODE_LOCKS=str(work / f"locks-{out.stem}"))
    environ.update(env or {})
    if device is not None:
        environ["CUDA_VISIBLE_DEVICES"] = device
    command = [sys.executable, *entry, "--start", how, "--size", size,
               "--checkpoint", str(checkpoint), "--json", str(out), *extra]
    with open(work / f"{out.stem}.log", "w") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(command, env=environ, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    process.result_path = out  # type: ignore[attr-defined]
    return process


def finish(process: subprocess.Popen) -> dict:
    if process.wait() != 0:
        log = Path(str(process.result_path).replace(".json", ".log")).read_text()  # type: ignore[attr-defined]
        raise SystemExit(f"a start failed:\n{log[-4000:]}")
    return json.loads(process.result_path.read_text())  # type: ignore[attr-defined]


def run(how: str, size: str, checkpoint: Path, *args, **kwargs) -> dict:
    drop_from_page_cache(checkpoint)
    return finish(start(how, size, checkpoint, *args, **kwargs))


def ensure_checkpoint(size: str) -> Path:
    """The example's checkpoint of ``size`` in the temporary directory, made first if it is not there (untimed)."""
    checkpoint = Path(tempfile.gettempdir()) / "buildops-tiny-llm" / f"{size}.safetensors"
    if not checkpoint.exists():
        from examples.tiny_llm.checkpoint import make_checkpoint
        from examples.tiny_llm.model import SIZES
        made = time.perf_counter()
        make_checkpoint(checkpoint, SIZES[size])
        print(f"made {checkpoint} ({checkpoint.stat().st_size / 1e9:.1f} GB) in {time.perf_counter() - made:.1f} s")
    return checkpoint


def prime_bytecode(work: Path) -> None:
    """One small start, untimed, that leaves every start after it the bytecode in PYCACHE (and makes the small
    checkpoint): imports only, nothing of it is measured."""
    small = Path(tempfile.gettempdir()) / "buildops-tiny-llm" / "small.safetensors"
    start("buildops", "small", small, work / "cache-prime", work).wait()


def drop_from_page_cache(path: Path) -> None:
    """Make the next start read the checkpoint from disk, as a server's first start does (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def phase(result: dict, name: str) -> float:
    return sum(seconds for phase_name, seconds in result["phases"] if phase_name.endswith(name))


def after_create(result: dict) -> float:
    return result["ready_s"] - result["imports_s"] - phase(result, "create model")


def report_rounds(rounds: list[tuple[dict, dict, dict]], build_per_core: float) -> None:
    """Each round's (a) load, (c) and (d) against the bound that round's load gives, then the medians."""
    print(f"\n{len(rounds)} rounds of (a), (c), (d); bound = max(that round's lazy load, build/cores) + 10%:")
    print(f"{'round':>6} {'lazy load s':>11} {'bound s':>7} {'(c) after create s':>18} {'met':>4} "
          f"{'(c) load s':>10} {'(c) wait s':>10} {'(c) gc s':>8} {'(d) after create s':>18} "
          f"{'(c) first/median steady':>23} {'late':>4}")
    rows = []
    for index, (lazy, c, d) in enumerate(rounds, 1):
        bound = 1.1 * max(phase(lazy, "load"), build_per_core)
        row = (phase(lazy, "load"), bound, after_create(c), phase(c, "load"), phase(c, "wait until ready"),
               phase(c, "collect garbage"), after_create(d), c["first_request_s"] / c["steady_request_median_s"])
        rows.append(row)
        print(f"{index:6d} {row[0]:11.2f} {row[1]:7.2f} {row[2]:18.2f} {'yes' if row[2] <= row[1] else 'no':>4} "
              f"{row[3]:10.2f} {row[4]:10.2f} {row[5]:8.2f} {row[6]:18.2f} {row[7]:23.2f} "
              f"{c['late_compiles'] + d['late_compiles']:4d}")
    medians = [statistics.median(column) for column in zip(*rows)]
    print(f"{'median':>6} {medians[0]:11.2f} {medians[1]:7.2f} {medians[2]:18.2f} "
          f"{'yes' if medians[2] <= medians[1] else 'no':>4} {medians[3]:10.2f} {medians[4]:10.2f} "
          f"{medians[5]:8.2f} {medians[6]:18.2f} {medians[7]:23.2f}")
    met = sum(row[2] <= row[1] for row in rows)
    print(f"(c) met its round's bound in {met} of {len(rows)} rounds; median (c) after create / median lazy load = "
          f"{medians[2] / medians[0]:.2f}; median (d) / median lazy load = {medians[6] / medians[0]:.2f}")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base")
    parser.add_argument("--ranks", type=int, default=1, help="also start this many ranks at once (one GPU each)")
    parser.add_argument("--variants", action="store_true",
                        help="also (c) on threads only, on processes only, and without the model's GEMM family")
    parser.add_argument("--rounds", type=int, default=1, help="start (a), (c) and (d) this many times each")
    parser.add_argument("--store", action="store_true",
                        help="also (c) storing its builds in a build store (a directory), then (s) a start with an "
                             "empty local cache that fetches them")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="buildops-startup-"))
    checkpoint = ensure_checkpoint(args.size)
    prime_bytecode(work)
    results = {}
    starts = [("(a) lazy", "lazy", "a", None, ()), ("(b) warmup", "warmup", "b", None, ()),
              ("(c) buildops", "buildops", "c", None, NO_WARM), ("(d) buildops, warm", "buildops", "c", None, NO_WARM),
              ("serial build", "buildops", "e", {"BUILDOPS_THREADS": "1", "BUILDOPS_EXECUTOR": "threads"}, NO_WARM)]
    starts.append(("(c) load after rehearsal", "buildops", "i", None, (*NO_WARM, "--load-after-rehearsal")))
    if args.store:  # a fresh node of a cluster whose store another node filled: its local cache is empty
        (work / "store").mkdir(exist_ok=True)
        store = {"BUILDOPS_STORE": f"file://{work / 'store'}"}
        starts += [("(c) buildops, storing", "buildops", "s1", store, NO_WARM),
                   ("(s) buildops, warm store", "buildops", "s2", store, NO_WARM)]
    if args.variants:  # what the default is made of: the executor, the family
        starts += [("(c) threads", "buildops", "f", {"BUILDOPS_EXECUTOR": "threads"}, NO_WARM),
                   ("(c) processes", "buildops", "g", {"BUILDOPS_EXECUTOR": "processes"}, NO_WARM),
                   ("(c) no family", "buildops", "h", None, (*NO_WARM, "--no-family"))]
    for label, how, cache, env, extra in starts:
        results[label] = run(how, args.size, checkpoint, work / f"cache-{cache}", work, env, extra=extra)
        print(f"{label}: ready {results[label]['ready_s']:.2f} s", flush=True)

    cores = len(os.sched_getaffinity(0))
    load = phase(results["(a) lazy"], "load")
    build = results["serial build"]["build_seconds"]
    bound = max(load, build / cores)
    tune = results["serial build"]["tune_seconds"]
    # What this host's cores were worth today: the builds and the load beside them live under this ceiling,
    # which moves from host to host more than the goal's 10%.
    from cpu_ceiling import cpu_ceiling  # this script's folder is on sys.path

    from buildops._config import default_workers

    workers = default_workers(cores)
    print(f"\n{args.size} model; {cores} cores ({workers} busy processes did {cpu_ceiling(workers):.1f}x the work of "
          f"one); load {load:.2f} s; serial build {build:.2f} s, of which autotuning {tune:.2f} s "
          f"(build / cores {build / cores:.2f} s)")
    # "after create": ready less this start's own imports and model creation; "after lazy's": less those of the
    # lazy start, which does no build work in either (a buildops start does some: its workers' start, the family).
    lazy = results["(a) lazy"]
    lazy_model = lazy["imports_s"] + phase(lazy, "create model")
    print(f"{'start':24} {'ready s':>8} {'after create s':>14} {'after lazy create s':>19} {'load s':>6} "
          f"{'first req ms':>12} {'steady ms':>9} {'median':>6} {'compiles serving':>16} {'tunes serving':>13} "
          f"{'late':>4} {'fetched':>7}")
    tokens = lazy["tokens"]
    for label, r in results.items():
        if label == "serial build":
            continue
        print(f"{label:24} {r['ready_s']:8.2f} {after_create(r):14.2f} {r['ready_s'] - lazy_model:19.2f} "
              f"{phase(r, 'load'):6.2f} "
              f"{r['first_request_s'] * 1e3:12.1f} {r['steady_request_s'] * 1e3:9.1f} "
              f"{r['steady_request_median_s'] * 1e3:6.1f} "
              f"{len(r['serving_compiles']):16d} {r['tuned_while_serving']:13d} {r['late_compiles']:4d} "
              f"{r.get('fetched_from_store', 0):7d}")
        assert r["tokens"] == tokens, f"{label}: other tokens than a lazy start"
    b, c = results["(b) warmup"], results["(c) buildops"]
    c_after_create = after_create(c)
    print(f"ready (c)/(b) = {c['ready_s'] / b['ready_s']:.2f}; (c) after create {c_after_create:.2f} s "
          f"({c['ready_s'] - lazy_model:.2f} s after the lazy start's) against "
          f"max(load, build/cores) + 10% = {1.1 * bound:.2f} s; first request (c)/steady = "
          f"{c['first_request_s'] / c['steady_request_s']:.2f} "
          f"({c['first_request_s'] / c['steady_request_median_s']:.2f} against the median); tokens identical in every "
          f"start; logits within {max(r['reference_error'] for r in results.values()):.1e} of torch")

    print("\nphases (s):")
    for label, r in results.items():
        print(f"  {label:24} " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in r["phases"]))

    if args.rounds > 1:
        rounds = [(results["(a) lazy"], c, results["(d) buildops, warm"])]
        for index in range(1, args.rounds):
            lazy_r = run("lazy", args.size, checkpoint, work / f"cache-a{index}", work)
            c_r = run("buildops", args.size, checkpoint, work / f"cache-c{index}", work, extra=NO_WARM)
            d_r = run("buildops", args.size, checkpoint, work / f"cache-c{index}", work, extra=NO_WARM)
            for label, r in (("(a) lazy", lazy_r), ("(c) buildops", c_r), ("(d) buildops, warm", d_r)):
                assert r["tokens"] == tokens, f"{label}, round {index + 1}: other tokens than the first lazy start"
            rounds.append((lazy_r, c_r, d_r))
            print(f"round {index + 1} done", flush=True)
        report_rounds(rounds, build / cores)

    if args.ranks > 1:
        print(f"\n{args.ranks} ranks of (c) at once, one GPU each, one shared Triton cache:")
        print(f"{'node locks':12} {'all ready s':>11} {'node CPU s':>10} {'late':>4}")
        for label, env in (("off", {"BUILDOPS_NODE_LOCKS": "off"}), ("on", {})):
            cache, locks = work / f"cache-ranks-{label}", work / f"locks-ranks-{label}"
            env = {"BUILDOPS_NODE_LOCKS": str(locks), **env}
            cpu = children_cpu()
            began = time.perf_counter()
            drop_from_page_cache(checkpoint)
            ranks = [start("buildops", args.size, checkpoint, cache, work, env, device=str(rank), extra=NO_WARM)
                     for rank in range(args.ranks)]
            done = [finish(rank) for rank in ranks]
            ready = max(r["ready_s"] for r in done)
            print(f"{label:12} {ready:11.2f} {children_cpu() - cpu:10.1f} {sum(r['late_compiles'] for r in done):4d}"
                  f"   (wall incl. serving {time.perf_counter() - began:.1f} s)")


if __name__ == "__main__":
    main()
