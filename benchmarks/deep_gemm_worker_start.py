"""How long a DeepGEMM build pool takes to start its workers, the wait of a pass's first builds: from the pool's
first call until each of its workers has run one (a worker's first call imports torch and the worker's code), with
the workers forked from a forkserver that imported those once (``forkserver``, buildops' pool) against spawned
workers that import them each (``spawn``).

    python benchmarks/deep_gemm_worker_start.py [--rounds 5] [--workers 4]

Each arm starts in a fresh process; the arms alternate within a round; the figure is each arm's median. Each call
holds its worker for a second, not counted, so that every worker takes one. No GPU or DeepGEMM is needed: the calls
run no GEMM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("spawn", "forkserver")
HOLD_SECONDS = 1.0


def child(arm: str, workers: int) -> dict:
    from benchmarks.deep_gemm_worker_start import held_pid  # by its module's name: workers import no main module
    from buildops._runtime.pools import WorkerPool
    from buildops.backends.deep_gemm.runs import in_worker
    from buildops.backends.deep_gemm.workers import FORKSERVER_PRELOAD

    pool = WorkerPool("DeepGEMM build", lambda: workers, preload=FORKSERVER_PRELOAD if arm == "forkserver" else ())
    start = time.perf_counter()
    executor = pool.get()
    # Each call holds its worker for HOLD_SECONDS, so that every worker takes one (their pids say so).
    calls = [executor.submit(in_worker, held_pid, "cpu") for _ in range(workers)]
    pids = {call.result() for call in calls}
    seconds = time.perf_counter() - start - HOLD_SECONDS
    pool.shutdown()
    return {"seconds": seconds, "workers": len(pids)}


def held_pid() -> int:
    time.sleep(HOLD_SECONDS)
    return os.getpid()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workers)))
        return
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for round_ in range(args.rounds):
        for arm in ARMS if round_ % 2 == 0 else reversed(ARMS):
            out = subprocess.run([sys.executable, __file__, "--child", arm, "--workers", str(args.workers)],
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                                 capture_output=True, text=True).stdout
            results[arm].append(json.loads(out.splitlines()[-1]))
    print(f"# {args.workers} workers, {args.rounds} rounds, {os.cpu_count()} CPUs; median seconds to each worker's "
          f"first call")
    medians = {arm: statistics.median(r["seconds"] for r in rs) for arm, rs in results.items()}
    for arm, rs in results.items():
        rounds = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        ran = sorted({r["workers"] for r in rs})
        print(f"{arm:<11} {medians[arm]:6.2f}  (rounds: {rounds}; workers that ran a call: {ran})")
    print(f"spawn / forkserver: {medians['spawn'] / medians['forkserver']:.2f}x")


if __name__ == "__main__":
    main()
