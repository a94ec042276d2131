"""Triton's interpreter (``TRITON_INTERPRET=1``, in a child process: it is read when ``@triton.jit`` decorates):
listing records the launches as compiled mode does, and the builds have nothing to compile. And the labels of
builds, which tell every build of a kernel apart."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from buildops import build_pass, report
from buildops.backends.triton import target, triton_builds
from buildops.backends.triton.interpret import NOTHING_TO_COMPILE
from buildops.testing import record_listings

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json
import torch
import buildops
from buildops.testing import record_listings
import triton_kernels as K

def listed():
    with record_listings() as rec:
        K.double_rows(torch.ones(40, 100))
        K.triple(torch.ones(1000))
    return {op: [[b.label for b in listing.builds if b.key[0] != "triton-autotune"] for listing in rec.of(op)]
            for op in rec.ops()}

before = listed()
with buildops.build_pass("warmup"):
    placeholder = K.double_rows(torch.ones(40, 100))
    K.triple(torch.ones(1000))
records = buildops.report().builds
print(json.dumps({
    "interpreted": type(K.rows_kernel).__name__,
    "listed": before,
    "placeholder": [list(placeholder.shape), placeholder.count_nonzero().item()],
    "states": sorted({r.state.value for r in records}),
    "skipped": [r.skipped for r in records],
    "returned": [r.build.run().value for r in records[:1]],
    "runs": K.double_rows(torch.ones(4, 8)).tolist()[0],  # outside the pass: the interpreter runs the kernel
}))
"""


def kernels():
    """tests/triton_kernels, imported when first needed: it imports examples/demo_ops, whose op names (matmul,
    rmsnorm, softmax) other test modules' ops hold when they are imported first."""
    import triton_kernels

    return triton_kernels


def labels_listed():
    K = kernels()
    with record_listings() as rec:
        K.double_rows(torch.ones(40, 100))
        K.triple(torch.ones(1000))
    # the compiles only: on a GPU an autotuned launch also lists its autotuning, which the interpreter does not
    return {op: [[b.label for b in listing.builds if b.key[0] != "triton-autotune"] for listing in rec.of(op)]
            for op in rec.ops()}


def test_in_the_interpreter_passes_list_as_compiled_and_build_nothing():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["interpreted"] == "InterpretedFunction"
    target()
    compiled = labels_listed()
    assert child["listed"] == compiled  # the same ops, shapes and labels as compiled mode
    assert child["placeholder"] == [[40, 100], 0]
    distinct = {label for listings in compiled.values() for labels in listings for label in labels}
    assert len(distinct) == 8  # double_rows: 3; triple: 2 configs at n=64, 3 at n=1000
    assert child["states"] == ["built"] and child["skipped"] == [NOTHING_TO_COMPILE] * len(distinct)
    assert child["returned"] == [NOTHING_TO_COMPILE]
    assert child["runs"] == [2.0] * 8


def test_labels_tell_every_build_of_the_demo_apart():
    kernels()  # imports examples/demo_ops, with examples/ on sys.path
    import demo_ops
    x = torch.empty(100, 256, dtype=torch.float16)
    with record_listings() as rec:
        demo_ops.matmul(x, torch.empty(256, 512, dtype=torch.float16))
        demo_ops.softmax(x)
        demo_ops.rmsnorm(x, torch.empty(256, dtype=torch.float16))
    builds = {b.key: b.label for listing in rec.listings for b in listing.builds
              if b.key[0] == "triton"}  # the compiles (on a GPU the matmul's autotunings are listed too)
    assert len(set(builds.values())) == len(builds) == 9  # one label per distinct build (7 of them matmul)
    smallest_tile = sorted(label for label in builds.values() if "BLOCK_M=16," in label)
    assert smallest_tile == [  # the three M specializations of one config: 1, a multiple of 16, another int
        "_matmul_kernel[fp16, M%16=0, N%16=0, K%16=0, BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, warps=4, ctas=1, "
        "stages=4]",
        "_matmul_kernel[fp16, M=1, N%16=0, K%16=0, BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, warps=4, ctas=1, stages=4]",
        "_matmul_kernel[fp16, N%16=0, K%16=0, BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, warps=4, ctas=1, stages=4]"]


def test_a_label_names_dtypes_alignment_and_scalar_types():
    K = kernels()
    target()
    x, h = torch.zeros(64), torch.zeros(64, dtype=torch.float16)

    def label(*args, **options):
        (build,) = triton_builds("add", K.add_kernel, *args, **options)
        return build.label

    assert label(x, x, x, 1, BLOCK=128) == "add_kernel[fp32, n=1, BLOCK=128]"
    assert label(x, x, x, 17, BLOCK=128, num_warps=8) == "add_kernel[fp32, BLOCK=128, warps=8]"
    assert label(x[1:], x, x, 32, BLOCK=128) == "add_kernel[fp32, x_ptr unaligned, n%16=0, BLOCK=128]"
    assert label(h, x, x, 2.0, BLOCK=128) == "add_kernel[x_ptr:fp16, y_ptr:fp32, out_ptr:fp32, n:fp32, BLOCK=128]"
    assert label(x, x, x, 2**40, BLOCK=128) == "add_kernel[fp32, n:i64%16=0, BLOCK=128]"


def test_the_interpreted_builds_count_apart_in_the_report():
    """In this process (compiled mode) a pass's builds compile; the report counts none as skipped."""
    K = kernels()
    with build_pass("warmup"):
        K.double_rows(torch.ones(40, 100))
    assert [r.skipped for r in report().builds] == [None] * 3
