"""Compile-only build throughput: the same Triton kernel variants built four ways in one run.

    python benchmarks/build_throughput.py [--workers N]

1. serial: one ``JITFunction.warmup`` after another, on the main thread;
2. threads: a plain thread pool of N calling warmup (what a thread-only builder does);
3. processes: a warm pool of N spawned processes, each compiling into the shared Triton cache;
4. buildops: each launch listed by ``buildops.backends.triton.triton_builds`` and submitted to the builder at once (as a
   pass does) with its default executor (auto), its worker processes already started (as they are once a pass's
   first build started them), then joined; this includes loading every kernel into the parent, as a pass does.

It also measures the CPU ceiling: how many times one process's pure-Python work N busy processes do at once.

Every way starts from an empty Triton cache dir and empty in-memory caches. The ideal is the serial compile time
divided by the number of CPUs. Without a GPU the kernels are compiled for sm_90.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing
import os
import sys
import tempfile
import time

import torch
from cpu_ceiling import cpu_ceiling  # this script's folder is on sys.path

# The demo's matmul (examples/demo_ops.py), compiled here per explicit tile shape rather than through its autotuner;
# spawned workers get this sys.path too, so they import it by the same name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def kernel():
    """The ``@triton.jit`` function under the demo matmul's ``@triton.autotune``."""
    from demo_ops import _matmul_kernel
    return _matmul_kernel.fn

TILES = [(m, n, k) for m in (16, 32, 64, 128) for n in (32, 64, 128) for k in (32, 64)]
DTYPES = (torch.float16, torch.bfloat16)


def variants():
    """48 distinct (args, options) launches of the matmul kernel."""
    return [((dtype, dtype, dtype, 512, 512, 512), {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k})
            for dtype in DTYPES for m, n, k in TILES]


def fresh_caches() -> None:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="buildops-throughput-")
    kernel().device_caches.clear()


def warmup(args, options) -> None:
    kernel().warmup(*args, grid=(1,), **options)


def process_compile(args, options, cache_dir) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    warmup(args, options)


@contextlib.contextmanager
def _timing_module_loads():
    """Time each module load (``CompiledKernel._init_handles``), which buildops' builds do on a GPU."""
    from triton.compiler.compiler import CompiledKernel
    original, loads = CompiledKernel._init_handles, []

    def timed_load(self):
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            loads.append(time.perf_counter() - start)
    CompiledKernel._init_handles = timed_load
    try:
        yield loads
    finally:
        CompiledKernel._init_handles = original


def timed(fn) -> float:
    fresh_caches()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    from buildops._config import cpu_share, default_workers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=default_workers(cpu_share()),
                        help="for every way (default: as many as buildops runs by default here)")
    args = parser.parse_args()
    workers = args.workers
    launches = variants()

    import buildops
    from buildops.backends.triton import target
    from buildops.backends.triton.worker import start

    t = target()  # a compile-only driver when there is no GPU
    fresh_caches()
    warmup(*launches[0])  # pay Triton's one-time per-process costs (hashing its install) outside the timings

    serial = timed(lambda: [warmup(a, o) for a, o in launches])
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        threads = timed(lambda: list(pool.map(lambda v: warmup(*v), launches)))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=start, initargs=(t.backend, t.arch, t.warp_size)) as pool:
        list(pool.map(time.sleep, [0.5] * workers))  # warm: every worker started and warmed by its initializer
        processes = timed(lambda: list(pool.map(process_compile, *zip(*launches),
                                                [os.environ["TRITON_CACHE_DIR"]] * len(launches))))

    from buildops._config import triton_executor
    from buildops.backends.triton import triton_builds
    from buildops.backends.triton.worker import workers as _processes
    with buildops.settings.scope(threads=workers, progress_after=3600):
        executor = triton_executor()
        if executor != "threads":  # buildops' own workers, started and warm, as a long pass would have them
            _processes.start()
            while not _processes.warm():
                time.sleep(0.05)
        builder = buildops._core.default.default_builder()

        listing = []

        def through_buildops():
            listed = 0.0
            for a, o in launches:  # each build queued as soon as it is listed, as a pass does
                start = time.perf_counter()
                builds = triton_builds("bench", kernel(), *a, **o)
                listed += time.perf_counter() - start
                for build in builds:
                    builder.submit(build)
            listing.append(listed)
            assert buildops.join() and buildops.report().total("failed") == 0
        with _timing_module_loads() as loads:
            default = timed(through_buildops)
    buildops.shutdown()

    ceiling = cpu_ceiling(workers)
    ideal = serial / cpu_share()
    print(f"# {len(launches)} variants, {workers} workers, {cpu_share()} CPUs, target {t.backend}:{t.arch}, "
          f"triton {__import__('triton').__version__}, torch {torch.__version__}")
    print(f"{'way':<24}{'wall s':>8}{'x serial':>10}{'ideal/wall':>12}")
    for name, seconds in (("serial", serial), (f"threads ({workers})", threads),
                          (f"processes ({workers}, warm)", processes), (f"buildops ({executor})", default)):
        print(f"{name:<24}{seconds:>8.2f}{serial / seconds:>10.2f}{ideal / seconds:>12.2f}")
    print(f"buildops / threads: {threads / default:.2f}x; ideal {ideal:.2f} s; of buildops' wall: listing "
          f"{listing[0]:.2f} s on the caller's thread, loading {len(loads)} modules {sum(loads):.2f} s in all")
    print(f"CPU ceiling: {workers} busy processes do {ceiling:.2f}x the work of one")


if __name__ == "__main__":
    main()
