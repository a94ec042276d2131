"""What listing costs the rehearsal's own thread: the whole sweep in the body, against the rest after it.

A model of 4 blocks of tests/dispatch_library.py's ops (rms_norm, silu through its aten override, softmax through a
launch cache, softmax through a tuner keyed on the row count), each op decorated on its own, as a user decorates a
library's ops, with a dense sweep of rows (16 to 4096 by 24: 171 shapes, most sharing a kernel). A rehearsal at
4096 rows lists them, in a fresh process with an empty Triton cache, two ways:

    body    every swept shape replayed in the body (a pass with ``lists_sweep_later = False``, as before 0.3)
    after   buildops' default: the called shape in the body, the rest on the background lister

Timed: the rehearsal (its ``with`` block, on the engine's thread), and until every shape is listed. A replay of
another op runs first, untimed: the imports a process's first replay pays are not listing.

    python3 benchmarks/listing.py [--rounds 3]

Runs on a GPU machine, or on CPUs (compiling for sm_90 without one). A line per start, then a table of medians.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from fresh_process import run_child  # this script's folder is on sys.path

ROOT = pathlib.Path(__file__).resolve().parents[1]
SWEEP = list(range(16, 4097, 24))
ROWS, WIDTH, BLOCKS = 4096, 1024, 4


def dispatch_library_here() -> tuple[Any, str, Any]:
    """tests/dispatch_library.py, this machine's device for it (``cpu`` compiles for sm_90 without a GPU) and its
    aten override registered there (a ``Library``: ``_destroy()`` takes it back)."""
    import warnings

    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    import dispatch_library as L

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        from buildops.backends.triton import target

        target()
    with warnings.catch_warnings():  # torch warns that the override replaces its own kernel: it is meant to
        warnings.simplefilter("ignore", UserWarning)
        override = L.register(device.upper())
    return L, device, override


def child(arm: str) -> dict:
    import torch
    import torch.nn.functional as F

    import buildops
    import buildops.testing
    from buildops import BuildConfig, DynamicSpec, lists_kernels, rehearsal

    L, device, override = dispatch_library_here()

    def op(fn, name):
        return lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=SWEEP)), output="x", name=name)(fn)

    rms_norm = op(lambda x, w: L.rms_norm(x, w), "rms_norm")
    silu = op(lambda x: F.silu(x), "silu")
    softmax = op(lambda x: L.softmax(x, -1), "softmax")
    softmax_tuned = op(lambda x: L.softmax_tuned(x, -1), "softmax_tuned")
    weights = [torch.ones(WIDTH, device=device) for _ in range(BLOCKS)]

    def forward(x):
        for w in weights:
            x = softmax_tuned(softmax(silu(rms_norm(x, w))))
        return x

    warm = op(lambda x: F.silu(L.rms_norm(x, weights[0])), "warm")
    with buildops.testing.record_listings():
        warm(torch.zeros(8, WIDTH, device=device))

    class ListingInBody(buildops.BuildPass):
        lists_sweep_later = False

    startup = ListingInBody("startup", join_at_exit=False) if arm == "body" else rehearsal("startup")
    begin = time.perf_counter()
    with startup:
        forward(torch.zeros(ROWS, WIDTH, device=device))
    body = time.perf_counter() - begin
    buildops.join()
    listed = len(startup.futures)
    done = time.perf_counter() - begin
    override._destroy()
    return {"arm": arm, "rehearsal_s": body, "all_built_s": done, "builds": listed}


def start(arm: str, work: pathlib.Path) -> dict:
    cache = tempfile.mkdtemp(prefix=f"triton-{arm}-", dir=work)
    result = run_child(__file__, arm, TRITON_CACHE_DIR=cache, BUILDOPS_NODE_LOCKS=str(pathlib.Path(cache) / "locks"))
    print(f"{arm:6} rehearsal {result['rehearsal_s']:6.2f} s  all built {result['all_built_s']:6.2f} s  "
          f"builds {result['builds']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results: dict[str, list[dict]] = {"body": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="buildops-listing-") as work:
        for _ in range(args.rounds):
            for arm in results:
                results[arm].append(start(arm, pathlib.Path(work)))
    print(f"\nmedians of {args.rounds} round(s); 4 ops x {len(SWEEP)} swept shapes x {BLOCKS} blocks")
    print("arm     rehearsal s  all built s  builds  rehearsal / body's")
    body = statistics.median(r["rehearsal_s"] for r in results["body"])
    for arm, runs in results.items():
        rehearsal = statistics.median(r["rehearsal_s"] for r in runs)
        print(f"{arm:7} {rehearsal:11.2f}  {statistics.median(r['all_built_s'] for r in runs):11.2f}  "
              f"{max(r['builds'] for r in runs):6}  {rehearsal / body:18.2f}")


if __name__ == "__main__":
    main()
