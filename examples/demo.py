"""The buildops demo: a build pass over a few Triton ops, then the report.

Each op declares its varying dim (the token count, dim 0) and lists the Triton kernels it will launch at each
swept token count; inside ``build_pass`` those become compile-only builds on the builder's worker threads. On a
machine without a GPU the kernels are compiled for an sm_90 target (real ptx and cubin, never launched).

    python examples/demo.py [--tokens 256] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="token count of the dummy batch (swept as pow2)")
    parser.add_argument("--cache-dir", help="Triton cache dir (default: a fresh temporary one, so builds compile)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # A fresh cache shows real compile times; a warm one shows what a restart costs (~1 ms a kernel).
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="buildops-demo-")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import buildops
    from demo_ops import matmul, rmsnorm, softmax, target

    print(f"buildops demo: {buildops.settings.threads} worker thread(s), target {target()}, "
          f"Triton cache {os.environ['TRITON_CACHE_DIR']}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    with buildops.build_pass("warmup"):
        for hidden in (1024, 4096):
            for dtype in (torch.float16, torch.bfloat16):
                x = torch.zeros(args.tokens, hidden, dtype=dtype, device=device)
                w = torch.zeros(hidden, dtype=dtype, device=device)
                h = rmsnorm(x, w)
                softmax(h)
                matmul(h, torch.zeros(hidden, 1024, dtype=dtype, device=device))
    wall = time.perf_counter() - start
    rep = buildops.report()
    print()
    print(rep.format())
    print()
    built, seconds = rep.total("built"), rep.total("build_seconds")
    print(f"{int(built)} kernel(s) built in {wall:.2f} s wall; {seconds:.2f} s of compile work "
          f"({seconds / wall:.1f}x parallel), {int(rep.total('failed'))} failed")

    x = torch.randn(37, 1024, device=device)  # outside the pass the ops run for real
    torch.testing.assert_close(rmsnorm(x, torch.ones(1024, device=device)),
                               x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    buildops.shutdown()
    if rep.total("failed"):
        sys.exit(1)


if __name__ == "__main__":
    main()
