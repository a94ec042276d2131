"""GPU tests (marker ``gpu``): run on a machine with CUDA; skipped elsewhere."""

import sys
import threading
from pathlib import Path

import pytest
import torch

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, builds_by_running, late_compiles, rehearsal, report, settings

from conftest import WAIT

pytestmark = pytest.mark.gpu


def test_builds_by_running_runs_on_a_worker_stream_and_is_a_gpu_build():
    seen = []
    gate = threading.Event()

    @builds_by_running(BuildConfig(DynamicSpec("x", 0, sweep=[16, 64])), output="x")
    def double(x):
        if torch.cuda.current_stream() != torch.cuda.default_stream():
            gate.wait(WAIT)
        seen.append((x.shape[0], torch.cuda.current_stream() != torch.cuda.default_stream(),
                     threading.current_thread().name))
        return x * 2

    x = torch.ones(32, 128, device="cuda")
    with rehearsal("startup"):
        assert torch.equal(double(x), torch.zeros_like(x))
    assert buildops.join(gpu_only=True, timeout=0.2) is False  # held: the builds count as GPU builds
    gate.set()
    assert buildops.join(gpu_only=True, timeout=WAIT)
    assert sorted(s[:2] for s in seen) == [(16, True), (64, True)]
    assert all(name.startswith("buildops-worker") for *_, name in seen)
    assert torch.equal(double(x), x * 2)


def test_demo_ops_after_a_pass_match_torch_with_no_late_compile():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from demo_ops import matmul, rmsnorm, softmax

    x = torch.randn(200, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    b = torch.randn(1024, 512, device="cuda", dtype=torch.float16) / 32
    with build_pass("warmup"):
        rmsnorm(x, w), softmax(x), matmul(x, b)
    assert report().total("failed") == 0 and report().total("built") > 0
    for rows in (200, 37, 1):  # any token count up to the one the pass saw
        xs = x[:rows]
        ref = (xs.float() * torch.rsqrt(xs.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
        with settings.scope(late_compile="error"):
            torch.testing.assert_close(rmsnorm(xs, w), ref, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(softmax(xs), torch.softmax(xs.float(), -1).half(), atol=1e-3, rtol=1e-2)
        torch.testing.assert_close(matmul(xs, b), (xs.float() @ b.float()).half(), atol=5e-2, rtol=2e-2)
    # The matmul's tuning key holds M: 37 rows, between the sweep's powers of two, compiled nothing but ran with the
    # config of the nearest tuned M while its own tuning was queued: a late tuning, never one on this thread.
    [late] = late_compiles()
    assert late.kind == "tuning" and late.kernel.endswith("_matmul_kernel") and "(37, 512, 1024" in late.variant


def test_real_deep_gemm_builds_run_every_shape():
    pytest.importorskip("deep_gemm")
    from buildops.backends.deep_gemm import GemmShape, deep_gemm_builds

    shapes = [GemmShape("dense", 4096, 7168), GemmShape("contiguous", 4096, 7168, 8)]
    builder = buildops._core.default.default_builder()
    builds = deep_gemm_builds(shapes, 256, mode="relaxed")  # a build per kernel DeepGEMM picks, and the scales'
    for build in builds:
        builder.submit(build)
    assert buildops.join(timeout=1800) and report().total("failed") == 0
    assert report().coverage()["deep_gemm"] == (len(builds), 0)


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_deep_gemm_builds_allocate_through_the_gate_on_the_gpu(tmp_path, monkeypatch, executor):
    """The fake DeepGEMM with CUDA operands: the memory gate reads real free memory; runs on a worker stream."""
    import json

    from buildops.backends.deep_gemm import GemmShape, deep_gemm_builds

    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_DEEP_GEMM_LOG", str(log))
    shapes = [GemmShape("dense", 2048, 1024), GemmShape("masked", 1024, 2048, 4)]
    with settings.scope(executor=executor):
        builder = buildops._core.default.default_builder()
        for build in deep_gemm_builds(shapes, 64, mode="relaxed", module="fake_deep_gemm"):
            assert build.uses_gpu
            builder.submit(build)
        assert buildops.join(timeout=WAIT * 30)
    assert report().total("failed") == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["fn"] for c in calls} == {"fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_masked",
                                         "get_mn_major_tma_aligned_tensor"}  # the scales' copy is a build too
    # A reserve no GPU has: nothing fits, and the report says so. A shape not built above: a kernel already in
    # DeepGEMM's cache is found there without operands.
    with settings.scope(gpu_reserve_mb=10 ** 9):
        for build in deep_gemm_builds([GemmShape("dense", 3072, 2048)], 32, mode="full", module="fake_deep_gemm"):
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 30)
    assert "NotEnoughGpuMemory" in report().format() and "will compile on first use" in report().format()


def test_graph_capture_waits_for_gpu_builds():
    gate = threading.Event()

    @builds_by_running(BuildConfig(DynamicSpec("x", 0, sweep=[8])), output="x")
    def slow(x):
        gate.wait(WAIT)
        return x + 1

    x = torch.ones(4, 16, device="cuda")
    with rehearsal("startup"):
        slow(x)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(buildops.GraphCaptureDuringBuild):
        with torch.cuda.graph(graph):
            x.mul_(2)
    gate.set()
    buildops.prepare_graph_capture(timeout=WAIT)
    static = torch.ones(4, 16, device="cuda")
    with torch.cuda.graph(graph):
        static.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, torch.full((4, 16), 2.0, device="cuda"))  # capturing does not run it; replay does


def test_autotuning_runs_in_the_build_so_the_first_call_benchmarks_nothing(monkeypatch, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from demo_ops import _matmul_kernel, matmul
    from triton.runtime.autotuner import Autotuner

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))  # no choice kept by an earlier run
    _matmul_kernel.cache.clear()
    x = torch.randn(200, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 384, device="cuda", dtype=torch.float16) / 16
    with build_pass("warmup"):
        matmul(x, b)
    tuned = [record.build for record in buildops.report().builds if "autotune" in record.build.label]
    assert len(tuned) == 9 and report().total("failed") == 0  # M = 1, 2, 4, ..., 128, 200
    benches = []
    original = Autotuner._bench
    monkeypatch.setattr(Autotuner, "_bench", lambda self, *a, **k: benches.append(1) or original(self, *a, **k))
    with settings.scope(late_compile="error"):
        for rows in (200, 128, 1):
            torch.testing.assert_close(matmul(x[:rows], b), (x[:rows].float() @ b.float()).half(), atol=5e-2,
                                       rtol=2e-2)
    assert benches == [] and late_compiles() == []
    assert len(list((tmp_path / "triton-cache" / "buildops-tunings").iterdir())) == 9  # every choice kept
    _matmul_kernel.cache.clear()  # as a restart finds it: the choices kept beside the cache are taken, untimed
    with build_pass("again"):
        matmul(x, b)
    assert len([r for r in buildops.report().builds if "autotune" in r.build.label]) == 9 and benches == []
    assert len(_matmul_kernel.cache) == 9


def test_variants_made_ready_together_build_their_shared_launcher_once(tmp_path, monkeypatch):
    import triton.runtime.build

    bt = pytest.importorskip("buildops.backends.triton.build")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import triton_kernels as K

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    K.add_kernel.device_caches.clear()
    x = torch.zeros(4096, device="cuda")
    kernels = [K.add_kernel.warmup(x, x, x, 4096, grid=(1,), BLOCK=block) for block in (64, 128, 256, 512, 1024)]
    host_builds = []
    build = triton.runtime.build._build
    monkeypatch.setattr(triton.runtime.build, "_build",
                        lambda name, *args, **kwargs: host_builds.append(name) or build(name, *args, **kwargs))
    start = threading.Barrier(len(kernels))
    threads = [threading.Thread(target=lambda k=k: (start.wait(WAIT), bt._make_launcher(k))) for k in kernels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 6)
    # One host compile where Triton (up to 3.6) builds a launcher per signature; none where it is generic.
    assert host_builds.count("__triton_launcher") <= 1, host_builds
    K.add_kernel[(1,)](x, x, x, 4096, BLOCK=1024)
    torch.cuda.synchronize()
