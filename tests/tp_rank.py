"""One rank of tests/test_tensor_parallel.py: torch.distributed on gloo (CPU), two decorated ops whose builds are
real Triton compiles (compile-only, for the default target), a rehearsal that leaves them in flight, then the
serving calls with an all-reduce between the two ops, as a tensor-parallel layer has. Prints a JSON summary."""

import json
import sys
import time

import torch
import torch.distributed as dist

import buildops
from buildops import BuildConfig, DynamicSpec, lists_kernels, rehearsal
from buildops.backends.triton import target, triton_builds

from triton_kernels import MATMUL_VARIANTS, matmul_kernel

RANK, WORLD, RENDEZVOUS, LATE_START = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
FIRST, SECOND = MATMUL_VARIANTS[:6], MATMUL_VARIANTS[6:]  # the two ops' kernels: 12 variants in all


def lister_of(variants):
    def lister(x):
        return [build for args, options in variants for build in triton_builds("matmul", matmul_kernel, *args,
                                                                                  **options)]
    return lister


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep="exact")), output="x")
def column_parallel(x):
    return x * 2  # the rank's half of a layer; its kernels are what the builds compile


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep="exact")), output="x")
def row_parallel(x):
    return x + 1


column_parallel.lister(lister_of(FIRST))
row_parallel.lister(lister_of(SECOND))


def main():
    dist.init_process_group("gloo", init_method=RENDEZVOUS, rank=RANK, world_size=WORLD)
    target()
    time.sleep(LATE_START)  # one rank starts its pass late: its builds are in flight at the others' collective
    x = torch.full((4, 8), float(RANK + 1))
    with rehearsal("startup"):
        row_parallel(column_parallel(x))
    start = time.perf_counter()
    y = column_parallel(x)  # serving: waits for its own builds only
    entered = time.time()  # the wall clock, to compare across the ranks
    dist.all_reduce(y)  # every rank meets here while another's builds may still run
    z = row_parallel(y)
    dist.all_reduce(z)
    first_request = time.perf_counter() - start
    assert buildops.join(timeout=600)
    built = time.time()
    rep = buildops.report()
    coverage = rep.coverage()["triton"]
    print(json.dumps({"rank": RANK, "compiled": coverage.compiled, "cached": coverage.cached,
                      "built": rep.total("built"), "failed": rep.total("failed"),
                      "late": len(buildops.late_compiles()), "fetched": rep.store.fetched if rep.store else None,
                      "first_request": first_request, "entered": entered, "builds_done": built,
                      "result": z.tolist()}), flush=True)
    dist.destroy_process_group()
    buildops.shutdown()


if __name__ == "__main__":
    main()
