"""A build worker's first build of a kernel from a heavy third-party package (fla-core's RMSNorm, as
examples/fla_lm decorates it): the kernel sent as source (the default) against the worker importing the kernel's
package by name (how workers built before kernels travelled as source).

    python benchmarks/worker_first_build.py [--rounds 3] [--workers 4]

Each arm runs in a fresh process with an empty Triton cache: it imports fla, starts the worker processes, waits until
they are warm, then times its first builds, one per worker at once (each worker's first), and then one more.
The figure is each arm's median over the rounds; the arms alternate within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(arm: str, workers: int) -> None:
    import concurrent.futures
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    from buildops import settings
    from buildops.backends.triton import build as triton_build
    from buildops.backends.triton.worker import workers as pool

    from examples.fla_lm import ops

    if arm == "import":  # no kernel travels as source: each worker imports fla to build
        triton_build.describe = lambda jit: "the benchmark's import arm"  # type: ignore[assignment]
    with settings.scope(executor="processes", threads=workers):
        pool.start()
        while not pool.warm():
            time.sleep(0.01)
        x = torch.empty(4096, 1024, dtype=torch.bfloat16, device="meta")
        builds = ops.rms_norm.builds_for(x, torch.empty(1024, dtype=torch.bfloat16, device="meta"))
        builds = [b for b in builds if b.library == "triton"][: workers + 1]
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(workers) as threads:
            outcomes = list(threads.map(lambda b: b.run(), builds[:workers]))
        first = time.perf_counter() - start
        start = time.perf_counter()
        outcomes.append(builds[workers].run())
        later = time.perf_counter() - start
        where = {o.where for o in outcomes}
    print(json.dumps({"arm": arm, "first": first, "later": later, "where": sorted(map(str, where))}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--arm", choices=("source", "import"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        child(args.arm, args.workers)
        return
    results: dict[str, list[dict]] = {"source": [], "import": []}
    with tempfile.TemporaryDirectory(prefix="buildops-first-build-") as work:
        for round_ in range(args.rounds):
            for arm in ("source", "import") if round_ % 2 == 0 else ("import", "source"):
                path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
                env = dict(os.environ, TRITON_CACHE_DIR=str(Path(work) / f"{arm}-{round_}"), PYTHONPATH=path,
                           BUILDOPS_NODE_LOCKS=str(Path(work) / f"locks-{arm}-{round_}"))
                done = subprocess.run([sys.executable, __file__, "--arm", arm, "--workers", str(args.workers)],
                                      env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
                if done.returncode != 0:
                    sys.exit(f"{arm} failed:\n{done.stderr[-3000:]}")
                results[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"| arm ({args.rounds} rounds, {args.workers} workers) | first builds, s (median) | "
          f"a later build, s (median) | where |")
    print("| --- | --- | --- | --- |")
    for arm, runs in results.items():
        print(f"| {arm} | {statistics.median(r['first'] for r in runs):.2f} | "
              f"{statistics.median(r['later'] for r in runs):.2f} | {'; '.join(runs[0]['where'])[:80]} |")


if __name__ == "__main__":
    main()
