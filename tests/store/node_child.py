"""One simulated node for the store's tests: a build pass over a Triton op with its own Triton cache, the store
from BUILDOPS_STORE; prints what it compiled, found and fetched as one JSON line. ``--hold KEY`` instead claims
KEY in the store, keeps renewing it, prints "held" and sleeps (a node that dies mid-build, once killed)."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_pass() -> None:
    import torch

    import buildops
    from buildops._core.default import default_builder

    from triton_kernels import double_rows

    with buildops.build_pass("node"):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            double_rows(torch.zeros(64, 32, dtype=dtype))
    coverage = buildops.report().coverage()["triton"]
    counts = default_builder().store_counts()
    print(json.dumps({"compiled": coverage.compiled, "cached": coverage.cached, "fetched": counts.fetched,
                      "stored": counts.stored, "waited": counts.waited_for_others}))
    buildops.shutdown()


def hold(key: str) -> None:
    from buildops import settings
    from buildops.store import open_store

    store = open_store(settings.store)
    lease = store.claim(key, settings.store_lease)
    assert lease is not None
    print("held", flush=True)
    while True:
        time.sleep(settings.store_lease / 3)
        lease.renew()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hold"]:
        hold(sys.argv[2])
    else:
        run_pass()
