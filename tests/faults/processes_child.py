"""One rank of test_processes: builds every MATMUL_VARIANT through buildops with worker processes, then loads each
one and prints a JSON summary: what its workers compiled or found cached, what this process compiled after the
builds (nothing, if they all landed), and a digest of each variant's binary."""

import hashlib
import json

from triton import knobs

import buildops
from buildops.backends.triton import target, triton_builds

from triton_kernels import MATMUL_VARIANTS, matmul_kernel


def main():
    target()
    builder = buildops._core.default.default_builder()
    for args, options in MATMUL_VARIANTS:
        for build in triton_builds("matmul", matmul_kernel, *args, **options):
            builder.submit(build)
    assert buildops.join(timeout=600)
    events = []  # per compile in this process from now on: True when Triton only loaded it from the disk cache
    knobs.compilation.listener = lambda *, cache_hit, **_: events.append(cache_hit)
    digests = []
    for args, options in MATMUL_VARIANTS:
        kernel = matmul_kernel.warmup(*args, grid=(1,), **options)
        digests.append(hashlib.sha256(kernel.asm["cubin"]).hexdigest())
    rep = buildops.report()
    coverage = rep.coverage()["triton"]
    print(json.dumps({"compiled": coverage.compiled, "cached": coverage.cached, "failed": rep.total("failed"),
                      "built": rep.total("built"), "late": events.count(False), "digests": digests}), flush=True)
    buildops.shutdown()


if __name__ == "__main__":
    main()
