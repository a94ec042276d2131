"""Does a DeepGEMM build starve the rest of the process? Measured with a fake DeepGEMM that holds the GIL for a
fixed time per run, as DeepGEMM's binding does while it compiles.

    python benchmarks/gil_starvation.py [--hold 0.5] [--runs 4]

The main thread plays a checkpoint load (copying tensors, a little Python per tensor) while one DeepGEMM build
runs ``--runs`` GEMMs each holding the GIL ``--hold`` seconds: on a builder thread, then in a worker process.
Reported: how many tensors the load copied in the same time, and its longest stall between two tensors.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def checkpoint_load(seconds: float) -> tuple[int, float]:
    """Copy 1 MiB tensors for ``seconds``; returns (tensors copied, longest gap between two copies)."""
    source = torch.ones(256, 1024)
    parameters = [torch.empty_like(source) for _ in range(64)]  # loading copies into existing parameters
    start = last = time.perf_counter()
    longest, i = 0.0, 0
    while time.perf_counter() - start < seconds:
        parameters[i % 64].copy_(source)
        now = time.perf_counter()
        longest, last, i = max(longest, now - last), now, i + 1
    return i, longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", type=float, default=0.5, help="seconds each fake GEMM run holds the GIL")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    os.environ["FAKE_DEEP_GEMM_LOG"] = os.path.join(tempfile.mkdtemp(), "calls.jsonl")
    os.environ["FAKE_DEEP_GEMM_GIL_SECONDS"] = str(args.hold)

    import buildops
    from buildops.backends.deep_gemm import GemmShape, deep_gemm_builds

    duration = args.hold * args.runs + 0.5
    rows = [("load alone", *checkpoint_load(duration))]
    for executor in ("threads", "processes"):
        with buildops.settings.scope(executor=executor):
            build = deep_gemm_builds([GemmShape("dense", 256, 256)], args.runs, mode="full",
                                     module="fake_deep_gemm", device="cpu")[0]
            if executor == "processes":  # start the worker first: measure the build, not a process start
                from buildops.backends.deep_gemm.runs import pool as _pool
                _pool.get().submit(int).result()
            future = buildops._core.default.default_builder().submit(build)
            threading.Event().wait(0.05)
            rows.append((f"build on {executor}", *checkpoint_load(duration)))
            future.result()
        buildops.shutdown()
    print(f"# fake DeepGEMM build: {args.runs} runs holding the GIL {args.hold} s each; {os.cpu_count()} CPUs")
    print(f"{'checkpoint load':<22}{'tensors copied':>15}{'longest stall s':>17}")
    for name, copied, stall in rows:
        print(f"{name:<22}{copied:>15}{stall:>17.3f}")


if __name__ == "__main__":
    main()
