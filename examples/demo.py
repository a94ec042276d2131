"""The buildops demo: a build pass over a few Triton ops, then the report.

Each op declares its varying dim (the token count, dim 0); inside ``build_pass`` its first call sweeps it and
queues a compile-only build for every Triton kernel variant the op will launch. On a GPU the demo then runs the ops
for real and checks them against torch, with late compiles turned into errors. On a machine without a GPU the
kernels are compiled for an sm_90 target (real PTX and cubins, never launched).

    python examples/demo.py [--tokens 256] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

# Triton 3.9 asks each program to choose its floating-point fusion default (it warns once where none is set): the
# demo keeps the one of every earlier Triton
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="token count of the dummy batch (swept as pow2)")
    parser.add_argument("--cache-dir", help="Triton cache dir (default: a fresh temporary one, so builds compile)")
    return parser.parse_args()


def check_against_torch(tokens: int) -> None:
    """Outside the pass the ops run for real; nothing may compile late."""
    from demo_ops import matmul, rmsnorm, softmax

    import buildops

    x = torch.randn(tokens, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 1024, device="cuda", dtype=torch.float16) / 64
    with buildops.settings.scope(late_compile="error"):
        normed = rmsnorm(x, w)
        torch.testing.assert_close(normed, (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                                            * w.float()).half(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(softmax(x), torch.softmax(x.float(), -1).half(), atol=1e-3, rtol=1e-2)
        torch.testing.assert_close(matmul(x, b), (x.float() @ b.float()).half(), atol=5e-2, rtol=2e-2)
    print(f"ops match torch at {tokens} tokens; late compiles: {len(buildops.late_compiles())}")


def main() -> None:
    args = parse_args()
    # A fresh cache shows real compile times; a warm one shows what a restart costs (~1 ms a kernel).
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="buildops-demo-")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from demo_ops import matmul, rmsnorm, softmax

    import buildops
    from buildops.backends.triton import target

    print(f"buildops demo: {buildops.settings.threads} worker thread(s), executor {buildops.settings.executor}, "
          f"target {target()}, Triton cache {os.environ['TRITON_CACHE_DIR']}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    with buildops.build_pass("warmup"):
        for hidden in (1024, 4096):
            for dtype in (torch.float16, torch.bfloat16):
                x = torch.zeros(args.tokens, hidden, dtype=dtype, device=device)
                h = rmsnorm(x, torch.zeros(hidden, dtype=dtype, device=device))
                softmax(h)
                matmul(h, torch.zeros(hidden, 1024, dtype=dtype, device=device))
    wall = time.perf_counter() - start
    rep = buildops.report()
    print()
    print(rep.format())
    print()
    built, seconds = rep.total("built"), rep.total("build_seconds")
    print(f"{int(built)} kernel(s) built in {wall:.2f} s wall; {seconds:.2f} s summed over builds; "
          f"{int(rep.total('failed'))} failed")
    if torch.cuda.is_available():
        check_against_torch(min(args.tokens, 8192))
    buildops.shutdown()
    if rep.total("failed"):
        sys.exit(1)


if __name__ == "__main__":
    main()
