"""On a GPU: the first launch of each demo op after a build pass, against its steady state and against a first
launch that had to compile (no pass covered it).

    python benchmarks/first_launch.py [--tokens 256]

A pass's builds also load each module, so the first launch after a pass should cost about what later ones do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def timed_call(fn, *args) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("first_launch.py needs a GPU")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="buildops-first-launch-")

    from demo_ops import matmul, rmsnorm, softmax

    import buildops

    x = torch.randn(args.tokens, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
    cases = {"rmsnorm": (rmsnorm, (x, w)), "softmax": (softmax, (x,)), "matmul": (matmul, (x, b))}
    with buildops.build_pass("warmup"):
        for fn, fn_args in cases.values():
            fn(*fn_args)

    xf = x.float()  # fp32: a variant no pass listed, so its first launch compiles
    uncovered = {"rmsnorm": (xf, w.float()), "softmax": (xf,), "matmul": (xf[:, :1024].half(), b[:1024])}
    print(f"# {torch.cuda.get_device_name()}, triton {__import__('triton').__version__}, {args.tokens} tokens")
    print(f"{'op':<10}{'first after pass ms':>21}{'steady ms':>11}{'ratio':>8}{'first, not built ms':>21}")
    for name, (fn, fn_args) in cases.items():
        first = timed_call(fn, *fn_args)
        steady = statistics.median(timed_call(fn, *fn_args) for _ in range(20))
        cold = timed_call(fn, *uncovered[name]) if name != "matmul" else float("nan")
        print(f"{name:<10}{first:>21.3f}{steady:>11.3f}{first / steady:>8.2f}{cold:>21.1f}")
    print(f"late compiles after the pass: {len(buildops.late_compiles())} (the fp32 calls above)")
    buildops.shutdown()


if __name__ == "__main__":
    main()
