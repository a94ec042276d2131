"""What a process's first replay costs: torch's Python meta kernels run as buildops runs them, against as torch does.

The first elementwise op a replay runs on meta tensors is one of torch's Python references, wrapped in
``torch._disable_dynamo``, whose first call imports torch's dynamo. A replay runs them without that import
(docs/decisions/0024-meta-kernels-without-dynamo.md). Two arms, each a fresh process listing one block of
tests/dispatch_library.py's ops (rms_norm, silu through its aten override, a residual add, softmax through a launch
cache and through a tuner) at 4096 rows with ``op.builds_for``, after the imports an engine makes (torch, Triton,
buildops, the library):

    buildops  buildops' replay
    torch     the same with torch's meta kernels left to import dynamo at their first call

Timed: the listing; and whether dynamo was imported after it.

    python3 benchmarks/first_replay.py [--rounds 5]

Runs on a GPU machine, or on CPUs (compiling for sm_90 without one). A line per start, then a table of medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time

from fresh_process import run_child  # this script's folder is on sys.path

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROWS, WIDTH = 4096, 1024


def child(arm: str) -> dict:
    import torch
    import torch.nn.functional as F

    import buildops._core.listing
    from buildops import BuildConfig, DynamicSpec, lists_kernels

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from listing import dispatch_library_here

    L, device, _ = dispatch_library_here()
    if arm == "torch":
        buildops._core.listing.dynamo_unimported = contextlib.nullcontext  # type: ignore[assignment]

    @lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[ROWS])), output="x")
    def block(x, w):
        h = F.silu(L.rms_norm(x, w))
        return x + L.softmax_tuned(L.softmax(h, -1), -1)

    x, w = torch.zeros(ROWS, WIDTH, device=device), torch.ones(WIDTH, device=device)
    begin = time.perf_counter()
    builds = block.builds_for(x, w)
    return {"arm": arm, "replay_s": time.perf_counter() - begin, "builds": len(builds),
            "dynamo": "torch._dynamo" in sys.modules}


def start(arm: str) -> dict:
    result = run_child(__file__, arm)
    print(f"{arm:8} first replay {result['replay_s']:5.2f} s  builds {result['builds']}  dynamo imported "
          f"{result['dynamo']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results: dict[str, list[dict]] = {"buildops": [], "torch": []}
    for _ in range(args.rounds):
        for arm in results:
            results[arm].append(start(arm))
    print(f"\nmedians of {args.rounds} round(s)")
    print("arm       first replay s  / torch's  builds  dynamo imported")
    baseline = statistics.median(r["replay_s"] for r in results["torch"])
    for arm, runs in results.items():
        seconds = statistics.median(r["replay_s"] for r in runs)
        print(f"{arm:9} {seconds:14.2f}  {seconds / baseline:8.2f}  {runs[0]['builds']:6}  "
              f"{any(r['dynamo'] for r in runs)}")


if __name__ == "__main__":
    main()
