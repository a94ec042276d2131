"""The CPU ceiling: how many times one process's pure-Python work N busy processes do at once.

    python3 benchmarks/cpu_ceiling.py [--workers N]

On a shared virtual machine it is below N (hyperthreads, other tenants, clocks under load) and it moves from host
to host: 12 busy processes did 4.7x to 6.8x the work of one on the same 16-core H200 host within an hour, 16 did
7.6x to 13.4x on others (docs/benchmarks.md). Every pool of compiles is held under it, and so is a start that
overlaps compiles with a checkpoint load, which is why the startup benchmark prints it beside its results.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import time


def spin(seconds_of_work: int) -> float:
    """Pure CPU work (no I/O, no shared memory); returns its own wall seconds."""
    start, total = time.perf_counter(), 0
    for i in range(seconds_of_work * 10_000_000):
        total += i
    return time.perf_counter() - start


def cpu_ceiling(workers: int) -> float:
    """How many times one process's work ``workers`` busy processes do at once (about 4 s)."""
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(time.sleep, [0.2] * workers))  # started
        alone = min(pool.submit(spin, 1).result() for _ in range(2))
        together = max(pool.map(spin, [1] * workers))
    return workers * alone / together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    workers = parser.parse_args().workers
    print(f"{workers} busy processes do {cpu_ceiling(workers):.2f}x the work of one "
          f"({len(os.sched_getaffinity(0))} CPUs)")


if __name__ == "__main__":
    main()
