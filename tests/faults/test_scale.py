"""Many call signatures in one pass: the cost of each stays flat as a pass sees thousands, and none is lost."""

import time
import tracemalloc

import torch

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, lists_kernels, report
from buildops._core.default import current_builder

from conftest import WAIT

SIGNATURES = 4000
CHUNK = 1000
# Generous on a shared machine: a cost that grows with the signatures already seen (a scan of them per call) makes
# the last thousand several times dearer than the first, and a flat one keeps them within noise of each other.
GROWTH = 3.0


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def test_four_thousand_signatures_cost_the_same_each_and_every_build_is_listed_once(runs):
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name="wide")
    def wide(x):
        return x

    wide.lister(lambda x: [runs.build("wide", ("wide", x.shape[1]))])
    seconds, grown = [], []  # per call; tracemalloc's traced memory grown over each chunk
    tracemalloc.start()
    try:
        with build_pass("warmup"):
            for first in range(1, SIGNATURES + 1, CHUNK):
                before = tracemalloc.get_traced_memory()[0]
                for width in range(first, first + CHUNK):  # dim 1 is not swept: each width is a call signature
                    x = torch.empty(1, width)
                    began = time.perf_counter()
                    wide(x)
                    seconds.append(time.perf_counter() - began)
                grown.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()

    per_call = [median(seconds[i:i + CHUNK]) for i in range(0, SIGNATURES, CHUNK)]  # medians: a GC pause is noise
    per_signature = [g / CHUNK for g in grown]
    for index, (s, b) in enumerate(zip(per_call, per_signature)):
        print(f"signatures {index * CHUNK + 1}-{(index + 1) * CHUNK}: {s * 1e6:.0f} us, {b:.0f} bytes per signature")
    assert per_call[-1] < GROWTH * per_call[0], per_call
    assert per_signature[-1] < GROWTH * per_signature[0], per_signature

    assert buildops.join(timeout=WAIT)
    (stats,) = report().ops
    assert (stats.op, stats.listed, stats.shared, stats.built, stats.failed, stats.cancelled, stats.pending) == \
        ("wide", SIGNATURES, 0, SIGNATURES, 0, 0, 0)
    assert sorted(runs.calls) == [("wide", width) for width in range(1, SIGNATURES + 1)]  # each built once
    assert not wide._self_op.pending and current_builder().busy == 0  # nothing left for a call to wait for
