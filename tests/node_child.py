"""One 'rank' of the node-sharing tests: builds every MATMUL_VARIANT through buildops, then checks that all of
them are in memory. Prints 'started' when it begins building, then a JSON summary."""

import json
import sys

from triton import knobs

events = []  # per compile in this process: True when Triton only loaded it from the disk cache
knobs.compilation.listener = lambda *, cache_hit, **_: events.append(cache_hit)

import buildops  # noqa: E402
from buildops.backends.triton import target, triton_builds  # noqa: E402

from triton_kernels import MATMUL_VARIANTS, matmul_kernel  # noqa: E402

target()
print("started", flush=True)
builder = buildops._core.default.default_builder()
for args, options in MATMUL_VARIANTS:
    for build in triton_builds("matmul", matmul_kernel, *args, **options):
        builder.submit(build)
assert buildops.join(timeout=600)
compiled = events.count(False)
for args, options in MATMUL_VARIANTS:  # every variant is in this process's memory now: no compile, no load
    matmul_kernel.warmup(*args, grid=(1,), **options)
rep = buildops.report()
print(json.dumps({"compiled": compiled, "loaded": events.count(True), "after": len(events) - compiled
                  - events.count(True), "built": rep.total("built"), "failed": rep.total("failed")}), flush=True)
sys.stdout.flush()
