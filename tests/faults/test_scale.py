"""Many call signatures in one pass: the cost of each stays flat as a pass sees thousands, and none is lost."""

import sys
import tracemalloc

import torch

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, lists_kernels, report
from buildops._core.default import current_builder

from conftest import WAIT

SIGNATURES = 4000
CHUNK = 1000
SAMPLE = 10  # every tenth call's Python lines are counted
# A cost that grows with the signatures already seen (a scan of them per call) makes the last thousand several
# times dearer than the first, in lines run and in memory; a flat one keeps them within noise of each other.
GROWTH = 1.5


def lines_run(fn, *args):
    """Call ``fn(*args)`` and return the Python lines it ran in this thread: a measure of its work that grows with
    any scan of what came before, and that a shared machine's load does not move, as it moves a time."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += event == "line"
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    return count


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def test_four_thousand_signatures_cost_the_same_each_and_every_build_is_listed_once(runs):
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name="wide")
    def wide(x):
        return x

    wide.lister(lambda x: [runs.build("wide", ("wide", x.shape[1]))])
    lines, grown = [], []  # per sampled call; tracemalloc's traced memory grown over each chunk
    tracemalloc.start()
    try:
        with build_pass("warmup"):
            for first in range(1, SIGNATURES + 1, CHUNK):
                before = tracemalloc.get_traced_memory()[0]
                for width in range(first, first + CHUNK):  # dim 1 is not swept: each width is a call signature
                    x = torch.empty(1, width)
                    if width % SAMPLE:
                        wide(x)
                    else:
                        lines.append(lines_run(wide, x))
                grown.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()

    per_chunk = CHUNK // SAMPLE
    per_call = [median(lines[i:i + per_chunk]) for i in range(0, len(lines), per_chunk)]
    per_signature = [g / CHUNK for g in grown]
    for index, (n, b) in enumerate(zip(per_call, per_signature)):
        print(f"signatures {index * CHUNK + 1}-{(index + 1) * CHUNK}: {n} lines per call, {b:.0f} bytes per signature")
    assert len(per_call) == SIGNATURES // CHUNK
    assert per_call[-1] < GROWTH * per_call[0], per_call
    assert per_signature[-1] < GROWTH * per_signature[0], per_signature

    assert buildops.join(timeout=WAIT)
    (stats,) = report().ops
    assert (stats.op, stats.listed, stats.shared, stats.built, stats.failed, stats.cancelled, stats.pending) == \
        ("wide", SIGNATURES, 0, SIGNATURES, 0, 0, 0)
    assert sorted(runs.calls) == [("wide", width) for width in range(1, SIGNATURES + 1)]  # each built once
    assert not wide._self_op.pending.futures and current_builder().busy == 0  # nothing left for a call to wait for
