"""Ops whose kernels sit behind torch custom ops: a replay runs the custom op's Python implementation for the call's
device (not its fake), so its Triton launches are listed, and built for real (sm_90 on a machine without a GPU)."""

import logging

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode
from triton import knobs

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, lists_kernels, report
from buildops._core.custom_ops import CustomOpRouter, implementation
from buildops.backends.triton import recording, target
from buildops.testing import record_listings

ROWS = BuildConfig(DynamicSpec("x", 0, sweep=[1, 16]))  # n = 8, n = 128: two variants


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * SCALE, mask=mask)


def launch_scale(x, scale, block):
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, block),)](x, out, n, SCALE=scale, BLOCK=block)
    return out


# -- the custom ops: each kind of registration --------------------------------------------------------------

@torch.library.custom_op("buildops_test::scale_faked", mutates_args=())
def scale_faked(x: torch.Tensor, scale: int) -> torch.Tensor:
    return launch_scale(x, scale, 256)


@scale_faked.register_fake
def _(x, scale):
    return torch.empty_like(x)


@torch.library.custom_op("buildops_test::scale_unfaked", mutates_args=())
def scale_unfaked(x: torch.Tensor, scale: int) -> torch.Tensor:
    return launch_scale(x, scale, 512)


_lib = torch.library.Library("buildops_test", "FRAGMENT")
_lib.define("scale_lib(Tensor x, int scale) -> Tensor")
_lib.impl("scale_lib", lambda x, scale: launch_scale(x, scale, 128), "CPU")
_lib.impl("scale_lib", lambda x, scale: launch_scale(x, scale, 1024), "CUDA")
torch.library.register_fake("buildops_test::scale_lib", lambda x, scale: torch.empty_like(x), lib=_lib)

_lib.define("scale_lib_unfaked(Tensor x, int scale) -> Tensor")
_lib.impl("scale_lib_unfaked", lambda x, scale: launch_scale(x, scale, 64), "CompositeExplicitAutograd")

_lib.define("cuda_only(Tensor x) -> Tensor")  # as vLLM registers its kernels: for the platform's key only
_lib.impl("cuda_only", lambda x: launch_scale(x, 3, 128), "CUDA")
torch.library.register_fake("buildops_test::cuda_only", lambda x: torch.empty_like(x), lib=_lib)

_lib.define("nothing_anywhere(Tensor x) -> Tensor")  # no implementation, no fake


# -- the ops that call them -------------------------------------------------------------------------------------

@lists_kernels(ROWS)
def faked(x):
    return scale_faked(x, 2)


@lists_kernels(ROWS)
def unfaked(x):
    return scale_unfaked(x, 2)


@lists_kernels(ROWS)
def through_library(x):
    return torch.ops.buildops_test.scale_lib(x, 2)


@lists_kernels(ROWS)
def through_library_unfaked(x):
    return torch.ops.buildops_test.scale_lib_unfaked.default(x, 2)


@lists_kernels(ROWS)
def direct_and_custom(x):
    """A launch of its own before the custom op: the meta run records it, and must not stop at it."""
    y = launch_scale(x, 5, 256)
    return scale_faked(y, 2)


@torch.library.custom_op("buildops_test::scale_decorated", mutates_args=())
@lists_kernels(ROWS)
def scale_decorated(x: torch.Tensor, scale: int) -> torch.Tensor:
    """The custom op's implementation itself decorated."""
    return launch_scale(x, scale, 256)


@pytest.fixture
def compiles(tmp_path, monkeypatch):
    """A fresh Triton cache; the compiles made, as (kernel, BLOCK)."""
    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    scale_kernel.device_caches.clear()
    made = []
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: made.append(
        (kw["fn"].name, kw["compile"]["constants"].get((4,))))
    yield made
    knobs.runtime.jit_post_compile_hook = previous


def blocks(rec, op):
    """The BLOCK of each build an op listed, per swept shape."""
    return [[b.label.split("BLOCK=")[1].split("]")[0] for b in listing.builds] for listing in rec.of(op)]


@pytest.mark.parametrize("op, block", [(faked, "256"), (unfaked, "512"), (through_library, "128"),
                                       (through_library_unfaked, "64")])
def test_a_custom_op_is_listed_through_its_implementation(op, block, compiles):
    x = torch.ones(40, 8)
    with record_listings() as rec:
        out = op(x)
    name = op.__name__
    assert blocks(rec, name) == [[block], [block]]
    assert torch.equal(out, torch.zeros(40, 8))  # the placeholder, inferred from the implementation's result
    assert compiles == []
    with build_pass("warmup"):
        op(x)
    assert report().total("built") == 2 and len(compiles) == 2
    assert {c[1] for c in compiles} == {int(block)}


def test_the_meta_run_goes_on_through_a_custom_op_after_a_launch_of_its_own():
    with record_listings() as rec:
        direct_and_custom(torch.ones(40, 8))
    assert blocks(rec, "direct_and_custom") == [["256", "256"], ["256", "256"]]
    labels = [b.label for b in rec.of("direct_and_custom")[0].builds]
    assert "SCALE=5" in labels[0] and "SCALE=2" in labels[1]


def test_the_implementation_is_the_one_for_the_device_the_tensors_claim():
    with FakeTensorMode():
        on_cuda = torch.empty(40, 8, device="cuda")

    @lists_kernels(ROWS, output=lambda x: x)
    def library_on_cuda(x):
        return torch.ops.buildops_test.scale_lib(x, 2)

    with record_listings() as rec:
        library_on_cuda(on_cuda)  # meta stand-ins of a cuda call: the CUDA implementation
        through_library(torch.ones(40, 8))  # a CPU call: the CPU one
    assert blocks(rec, "library_on_cuda") == [["1024"], ["1024"]]
    assert blocks(rec, "through_library") == [["128"], ["128"]]

    mode = FakeTensorMode()
    with mode:
        fake_cuda, fake_cpu = torch.empty(8, device="cuda"), torch.empty(8)
    router = CustomOpRouter()
    with recording("by hand") as builds, mode, router:
        torch.ops.buildops_test.scale_lib(fake_cuda, 2)
        torch.ops.buildops_test.scale_lib(fake_cpu, 2)
    assert router.routed == {"buildops_test::scale_lib": "its Python kernel for CUDA"}  # the first found, kept
    assert ["BLOCK=1024" in b.label for b in builds] == [True, False]
    assert implementation(torch.ops.buildops_test.scale_lib.default, "cpu")[1] == "its Python kernel for CPU"
    assert implementation(torch.ops.buildops_test.scale_faked.default, "cuda")[1] == "its default implementation"


def test_a_decorated_implementation_lists_in_a_pass_and_compiles(compiles):
    x = torch.ones(40, 8)
    with record_listings() as rec:
        out = scale_decorated(x, 3)  # through the dispatcher, into the decorated implementation
    assert rec.ops() == ["scale_decorated"] and blocks(rec, "scale_decorated") == [["256"], ["256"]]
    assert torch.equal(out, torch.zeros(40, 8))
    with build_pass("warmup"):
        scale_decorated(x, 3)
    assert report().total("built") == 2 and len(compiles) == 2


def test_a_decorated_custom_op_object_takes_its_implementations_signature():
    @lists_kernels(ROWS)
    @torch.library.custom_op("buildops_test::scale_outer", mutates_args=())
    def scale_outer(x: torch.Tensor, scale: int) -> torch.Tensor:
        return launch_scale(x, scale, 256)

    with record_listings() as rec:
        scale_outer(torch.ones(40, 8), 2)
    assert rec.ops() == ["scale_outer"] and blocks(rec, "scale_outer") == [["256"], ["256"]]
    with pytest.raises(buildops.SpecError, match=r"names no argument of misdeclared; its arguments are "
                                                 r"\['x', 'scale'\]"):
        @lists_kernels(BuildConfig(DynamicSpec("y", 0)))
        @torch.library.custom_op("buildops_test::misdeclared", mutates_args=())
        def misdeclared(x: torch.Tensor, scale: int) -> torch.Tensor:
            return x


def test_a_custom_op_without_a_python_implementation_for_the_device_is_named(caplog):
    @lists_kernels(ROWS, output="x")
    def cpu_call_of_a_cuda_kernel(x):
        return torch.ops.buildops_test.cuda_only(x)

    with caplog.at_level(logging.WARNING, logger="buildops"), record_listings() as rec:
        cpu_call_of_a_cuda_kernel(torch.ones(40, 8))
    assert rec.keys() == []
    warned = [r.getMessage() for r in caplog.records if "cpu_call_of_a_cuda_kernel" in r.getMessage()]
    assert len(warned) == 1  # once, not once per swept shape
    assert ("custom op buildops_test::cuda_only ran its fake implementation: it has no kernel for cpu"
            in warned[0])

    @lists_kernels(ROWS, output="x")
    def no_kernel_at_all(x):
        return torch.ops.buildops_test.nothing_anywhere(x)

    with pytest.raises(buildops.SpecError, match=r"replay of no_kernel_at_all at \{'x.0': 1\} failed: .*"
                                                 r"custom op buildops_test::nothing_anywhere ran its fake "
                                                 r"implementation: it has no kernel for cpu"):
        with record_listings():
            no_kernel_at_all(torch.ones(40, 8))


def test_a_cpp_kernel_is_named_as_such():
    op = torch.ops._quantized.wrapped_fbgemm_pack_gemm_matrix_fp16.default
    assert implementation(op, "cpu") == (None, "its kernel for CPU is not Python (a C++ kernel)")
    assert implementation(torch.ops.aten.add.Tensor, "cpu")[0] is None


@pytest.mark.gpu
def test_on_a_gpu_the_custom_ops_kernels_are_built_and_the_real_calls_compile_nothing():
    from buildops import late_compiles, settings

    x = torch.randn(40, 8, device="cuda")
    with build_pass("warmup"):
        placeholder = through_library(x)  # the CUDA implementation (BLOCK=1024), found from meta stand-ins
        faked(x)
        scale_decorated(x, 3)
    assert placeholder.device.type == "cuda" and placeholder.count_nonzero() == 0
    assert report().total("failed") == 0 and report().total("built") == 6
    with settings.scope(late_compile="error"):
        for rows in (40, 16, 1):  # n = 320 and 128 (multiples of 16) and 8: the variants the sweep built
            xs = x[:rows]
            torch.testing.assert_close(through_library(xs), xs * 2)
            torch.testing.assert_close(faked(xs), xs * 2)
            torch.testing.assert_close(scale_decorated(xs, 3), xs * 3)
    assert late_compiles() == []
