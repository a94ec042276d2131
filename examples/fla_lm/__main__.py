"""One build pass over a dummy forward of a small model made of fla's kernels, then (on a GPU) requests at token
counts within the sweep, with late compiles as errors.

    python -m examples.fla_lm [--tokens 256] [--save out.pt]

With ``BUILDOPS=0`` the same script runs without buildops: the pass is a plain block, every kernel compiles on first
use. ``--save`` keeps the requests' logits, so that two runs can be compared (``tests/test_fla.py`` does).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import buildops

from .model import Config, Model

REQUEST_TOKENS = (100, 37, 1, 256, 200)  # within the dummy forward's sweep, none a power of two but 1 and 256


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256, help="the dummy forward's token count: the sweep's top")
    parser.add_argument("--save", help="save the requests' logits here (GPU only)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla, on a CPU

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Model(Config()).to(device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    with torch.no_grad(), buildops.build_pass("warmup"):
        model(torch.zeros(args.tokens, dtype=torch.long, device=device))
    print(f"build pass: {time.perf_counter() - start:.2f} s")
    print(buildops.report().format())
    if device != "cuda":  # kernels compiled for sm_90 through the compile-only driver; nothing to run them on
        return

    logits = []
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad(), buildops.settings.scope(late_compile="error"):  # a kernel compiled now would raise
        for tokens in REQUEST_TOKENS:
            ids = torch.randint(Config().vocab, (tokens,), generator=generator).to(device)
            logits.append(model(ids).float().cpu())
    print(f"{len(REQUEST_TOKENS)} requests at {REQUEST_TOKENS} tokens; late compiles: {len(buildops.late_compiles())}")
    if args.save:
        torch.save(logits, args.save)
    buildops.shutdown()


if __name__ == "__main__":
    main()
