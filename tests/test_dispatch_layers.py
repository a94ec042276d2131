"""Libraries with a dispatch layer of their own between their ops and Triton (tests/dispatch_library.py): after a
pass, every object a replay handed such a layer behaves as what a lazy run would have handed it. Compiled for real
(sm_90 through the compile-only driver on a machine without a GPU)."""

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from buildops import BuildConfig, DynamicSpec, build_pass, late_compiles, lists_kernels, rehearsal, settings
from buildops.backends.triton import build as triton_build
from buildops.backends.triton import driver, target
from buildops.backends.triton.pending import PendingKernel
from buildops.testing import record_listings

import dispatch_library as L
from conftest import WAIT

ROWS = [1, 16, 64]
ORIGINAL_JIT_RUN = JITFunction.run


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=ROWS)), output="x")
def block(x, w):
    """A model's block made of the library's ops: one called directly, one through an aten override, one
    autotuned."""
    return L.softmax(F.silu(L.rms_norm(x, w)), -1)


@pytest.fixture(autouse=True)
def library(tmp_path, monkeypatch):
    """A fresh Triton cache and launch caches; the library's aten override on this machine's tensors; and the
    compiles seen (kernel name, constexprs by parameter position)."""
    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    L.forget()
    for kernel in (L._rms_norm_kernel, L._silu_kernel, driver.inner_jit(L._softmax_kernel)):
        kernel.device_caches.clear()
    L._softmax_kernel.cache.clear()
    with warnings.catch_warnings():  # torch warns that the override replaces its own kernel: it is meant to
        warnings.simplefilter("ignore", UserWarning)
        override = L.register("CUDA" if torch.cuda.is_available() else "CPU")
    compiles = []
    previous = knobs.runtime.jit_post_compile_hook

    def seen(**kw):
        compiles.append((kw["fn"].name, kw["compile"]["constants"]))

    knobs.runtime.jit_post_compile_hook = seen
    yield compiles
    knobs.runtime.jit_post_compile_hook = previous
    override._destroy()


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def softmax_entry(x):
    """What the library's launch cache keeps for a softmax of ``x``'s shape (rows > 1 share an entry)."""
    return L.softmax_launcher.kernels[L.softmax_launcher.key((x, x, x.shape[0], x.shape[1]), {"BLOCK": x.shape[1]})]


def lazy_kernel(jit, *args, **kwargs):
    """The compiled kernel a lazy run's launch would find (and return) for these arguments."""
    return jit.warmup(*args, grid=(1,), **kwargs)


def test_a_pass_leaves_pending_kernels_in_a_launch_cache_that_resolve_to_what_a_lazy_run_returns(library):
    x, w = torch.zeros(40, 256, device=device()), torch.ones(256, device=device())
    with build_pass("warmup"):
        block(x, w)
    built = len(library)
    assert built > 0 and JITFunction.run is ORIGINAL_JIT_RUN
    # one entry per key of the library's own: n_cols=256 with rows 1 and > 1 share it (rows are no argument)
    [(rms_kernel, _)] = L.rms_norm_launcher.kernels.values()
    assert isinstance(rms_kernel, PendingKernel)
    resolved = rms_kernel.resolve()
    assert isinstance(resolved, CompiledKernel) and rms_kernel.resolve() is resolved
    out = torch.empty_like(x)
    assert resolved is lazy_kernel(L._rms_norm_kernel, x, w, out, 256, 1e-6, BLOCK=256)
    assert rms_kernel.metadata is resolved.metadata  # any attribute is the compiled kernel's
    for kernel, _ in L.silu_launcher.kernels.values():
        assert isinstance(kernel.resolve(), CompiledKernel)
    assert len(library) == built and late_compiles() == []  # resolving compiled nothing: the builds did


def test_serving_through_the_launch_cache_launches_the_built_kernel(library):
    x, w = torch.zeros(16, 256, device=device()), torch.ones(256, device=device())
    with build_pass("warmup"):
        block(x, w)
    built = len(library)
    with settings.scope(late_compile="error"):
        if driver.compile_only():  # no GPU: the launch gets to the real kernel, which the driver cannot load
            with pytest.raises(RuntimeError, match="never loaded or launched"):
                L.rms_norm(x, w)
        else:
            torch.testing.assert_close(L.rms_norm(x, w), F.rms_norm(x, (256,), w, 1e-6))
    assert len(library) == built and late_compiles() == []


@pytest.mark.gpu
def test_on_a_gpu_the_block_serves_from_its_builds_and_matches_torch(library):
    w = torch.randn(256, device="cuda")
    with build_pass("warmup"):
        block(torch.zeros(64, 256, device="cuda"), w)
    built = len(library)
    with settings.scope(late_compile="error"):
        for rows in (1, 16, 64, 16, 1):  # through the launch caches' kept kernels after the first of each
            x = torch.randn(rows, 256, device="cuda")
            h = F.rms_norm(x, (256,), w, 1e-6)
            torch.testing.assert_close(block(x, w), torch.softmax(h * torch.sigmoid(h), -1))
    assert len(library) == built and late_compiles() == []


def test_a_tuner_read_back_after_a_replay_gives_the_config_of_the_kernel_it_returned(library):
    x = torch.zeros(64, 256, device=device())
    with record_listings():
        block(x, torch.ones(256, device=device()))
    kernel, constexprs = softmax_entry(torch.zeros(64, 256))
    first = L._softmax_kernel.configs[0]
    assert constexprs["ROWS"] == first.kwargs["ROWS"] and constexprs["num_warps"] == first.num_warps
    assert L._softmax_kernel.best_config == first  # nothing tuned: the first config, as its kernel
    resolved = kernel.resolve()
    out = torch.empty_like(x)
    assert resolved is lazy_kernel(L._softmax_kernel.fn, x, out, 64, 256, BLOCK=256, **first.all_kwargs())


def test_a_replay_reads_back_the_config_tuned_for_the_nearest_key(library):
    tuned = L._softmax_kernel.configs[2]
    L._softmax_kernel.cache[(48, 256, "torch.float32", "torch.float32")] = tuned  # a tuning of 48 rows
    L._softmax_kernel.cache[(4096, 256, "torch.float32", "torch.float32")] = L._softmax_kernel.configs[1]
    with build_pass("warmup"):
        block(torch.zeros(40, 256, device=device()), torch.ones(256, device=device()))
    kernel, constexprs = softmax_entry(torch.zeros(64, 256))
    assert constexprs["ROWS"] == tuned.kwargs["ROWS"]  # what the library read back (on a GPU, tunings follow)
    rows = (L._softmax_kernel.fn.arg_names.index("ROWS"),)
    assert {c[1][rows] for c in library if c[0] == "_softmax_kernel"} == {1, 2, 4}  # every config built ...
    assert kernel.resolve().src.constants[rows] == tuned.kwargs["ROWS"]  # ... the one read back resolved


def test_a_pending_kernel_waits_for_its_build_in_flight(library, monkeypatch):
    gate, started = threading.Event(), threading.Event()
    run = triton_build.WarmupRun.__call__

    def held(self):
        started.set()
        assert gate.wait(WAIT)
        return run(self)

    monkeypatch.setattr(triton_build.WarmupRun, "__call__", held)
    x, w = torch.zeros(4, 64, device=device()), torch.ones(64, device=device())
    with settings.scope(threads=1), rehearsal("startup"):  # does not wait: the builds are held
        block(x, w)
    [(kernel, _)] = L.rms_norm_launcher.kernels.values()
    assert started.wait(WAIT)
    resolved = {}
    waiter = threading.Thread(target=lambda: resolved.setdefault("kernel", kernel.resolve()))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and library == []  # it waits, and compiles nothing itself
    gate.set()
    waiter.join(WAIT)
    assert isinstance(resolved["kernel"], CompiledKernel) and late_compiles() == []
    assert [c[0] for c in library].count("_rms_norm_kernel") == 1  # by its build alone


def test_a_pending_kernel_whose_build_never_ran_compiles_on_first_use_as_a_lazy_run_does(library):
    x, w = torch.zeros(8, 64), torch.ones(64)
    from buildops.backends.triton import recording

    with recording("op") as builds:
        kernel = L._rms_norm_kernel.run(x, w, torch.empty_like(x), 64, 1e-6, grid=(8,), warmup=False, BLOCK=64)
    assert isinstance(kernel, PendingKernel) and len(builds) == 1 and library == []
    assert kernel.resolve() is lazy_kernel(L._rms_norm_kernel, x, w, torch.empty_like(x), 64, 1e-6, BLOCK=64)
    assert [c[0] for c in library] == ["_rms_norm_kernel"]  # compiled once, by the resolve


def test_a_pending_kernel_launched_in_a_later_replay_records_its_build_again(library):
    with record_listings() as rec:
        block(torch.zeros(64, 128, device=device()), torch.ones(128, device=device()))
    listings = rec.of("block")
    assert [listing.dims["x.0"] for listing in listings] == ROWS
    for listing in listings:  # each shape lists the library's three kernels, though only the first ran `run`
        names = {key[1].rpartition(".")[2] for key in listing.keys if key[0] == "triton"}
        assert names == {"_rms_norm_kernel", "_silu_kernel", "_softmax_kernel"}, listing.dims
    assert library == []


def test_aten_overrides_list_through_their_python_kernel(library):
    with record_listings() as rec:
        block(torch.zeros(16, 128, device=device()), torch.ones(128, device=device()))
    assert any("_silu_kernel" in str(key) for key in rec.keys("block"))


def test_an_aten_op_no_library_overrode_stays_torch_s_own_and_lists_nothing(library):
    @lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[4])), output="x")
    def gelu(x):  # the control: the fixture's library overrides silu, not gelu
        return F.gelu(x)

    with record_listings() as rec:
        gelu(torch.zeros(4, 8, device=device()))
    assert rec.keys("gelu") == []


def test_a_module_level_function_whose_first_parameter_is_self_decorates_as_a_function(library):
    softmax = lists_kernels(BuildConfig(DynamicSpec("self", dim=0, sweep=[1, 8])), output="self")(L.softmax)
    silu = lists_kernels(BuildConfig(DynamicSpec(0, dim=0, sweep=[1, 8])), output="self")(L.silu)  # by position
    with record_listings() as rec:
        softmax(torch.zeros(8, 64, device=device()), -1)
        silu(torch.zeros(8, 64, device=device()))
    assert rec.dims(softmax.op_name) == [{"self.0": 1}, {"self.0": 8}]
    assert rec.dims(silu.op_name) == [{"0.0": 1}, {"0.0": 8}]
    assert rec.keys(softmax.op_name) and rec.keys(silu.op_name)
