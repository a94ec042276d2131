"""What collecting a rehearsal's garbage costs: the tiny LLM's rehearsal replayed on meta tensors (nothing is built),
then a collection of the young generations (``gc.collect(1)``) against a full one (what ``rehearse_then_load`` does
after the load), and a full one with the heap frozen before the rehearsal (``rehearse_then_load(...,
freeze_heap=True)``).

    python3 benchmarks/rehearsal_garbage.py [--size base] [--repeats 3]

Run from the repository root; CPU only. A full collection walks every object the process holds (torch's and
Triton's included). Right after a bare rehearsal its garbage is young; in a start, what outlives two automatic
collections during the load is not, which this does not show.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from buildops.testing import record_listings

from examples.tiny_llm.model import SIZES, TinyLlm


def rehearse_then_collect(model: TinyLlm, generation: int, frozen: bool = False) -> tuple[float, int, float, int]:
    """(seconds, objects) of ``gc.collect(generation)`` after a rehearsal, then of a full collection after it;
    ``frozen``: the heap frozen before the rehearsal, and unfrozen after both."""
    gc.collect()
    if frozen:
        gc.freeze()
    try:
        with record_listings():  # lists, builds nothing
            model.rehearse()
        began = time.perf_counter()
        found = gc.collect(generation)
        first = time.perf_counter() - began
        began = time.perf_counter()
        left = gc.collect()
        return first, found, time.perf_counter() - began, left
    finally:
        gc.unfreeze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = TinyLlm(SIZES[args.size], "meta")
    print(f"{'collection after the rehearsal':32} {'ms':>7} {'objects':>7} {'then full ms':>12} {'objects left':>12}")
    for _ in range(args.repeats):
        for label, generation, frozen in (("young (gc.collect(1))", 1, False), ("full (gc.collect())", 2, False),
                                          ("full, the heap frozen before", 2, True)):
            seconds, found, full, left = rehearse_then_collect(model, generation, frozen)
            print(f"{label:32} {seconds * 1e3:7.2f} {found:7d} {full * 1e3:12.1f} {left:12d}")


if __name__ == "__main__":
    main()
