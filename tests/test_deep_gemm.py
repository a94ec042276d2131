"""DeepGEMM builds by running, against a fake module with DeepGEMM's public signatures (DeepGEMM itself cannot be
installed on the CPU machines)."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import buildops
from buildops import build_pass, model_created, register_family, report, settings, unregister_family
from buildops._core.build import Build
from buildops._runtime.gpu import MemoryGate, NotEnoughGpuMemory
from buildops.backends.deep_gemm import (
    DeepGemmFamily,
    GemmShape,
    contiguous_rows,
    deep_gemm_builds,
    find_gemm_shapes,
    m_values,
)
from buildops.backends.deep_gemm.heuristics import tilings
from buildops.backends.deep_gemm.runs import GemmRun, ScalesRun

from conftest import WAIT


def gemm_builds(*args, **kwargs):
    """The GEMM builds of ``deep_gemm_builds(*args, **kwargs)``, without the scales' copies."""
    return [b for b in deep_gemm_builds(*args, **kwargs) if isinstance(b.run, GemmRun)]


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """The fake's calls, read from its log (it may run in worker processes)."""
    log = tmp_path / "deep_gemm_calls.jsonl"
    monkeypatch.setenv("FAKE_DEEP_GEMM_LOG", str(log))

    def read():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return read


def test_m_sweeps():
    assert m_values(300, 4096, "full") == tuple(range(1, 301))
    assert m_values(300, 4096, "off") == ()
    relaxed = m_values(8192, 7168, "relaxed", sms=132)
    assert relaxed[:4] == (1, 2, 4, 8) and relaxed[-1] == 8192 and 64 in relaxed and 4096 in relaxed
    assert len(relaxed) < 8192 / 10 and all(1 <= m <= 8192 for m in relaxed)
    assert 132 * 128 // (7168 // 256) in relaxed  # one full wave of 128 x 256 tiles
    with settings.scope(deep_gemm_m="off"):
        assert m_values(100, 512) == ()


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(256, 512, bias=False).to(torch.float8_e4m3fn)
        self.o = nn.Linear(512, 256, bias=False).to(torch.float8_e4m3fn)
        self.o_again = nn.Linear(512, 256, bias=False).to(torch.float8_e4m3fn)  # same shape: built once
        self.experts = nn.Parameter(torch.empty(4, 384, 256).to(torch.float8_e4m3fn), requires_grad=False)
        self.norm = nn.LayerNorm(256)  # not fp8: not DeepGEMM's


def test_shapes_are_found_in_a_models_layers():
    assert find_gemm_shapes(MoE(), grouped=("contiguous", "masked")) == [  # in parameters() order
        GemmShape("contiguous", 384, 256, 4), GemmShape("masked", 384, 256, 4),
        GemmShape("dense", 512, 256), GemmShape("dense", 256, 512)]


def test_the_contiguous_sweep_reaches_the_rows_of_every_experts_padding():
    """The real DeepGEMM picks a contiguous kernel by the padded rows, which exceed the tokens: 1024 tokens routed
    to 8 experts take up to 1024 + 8 x 127 rows."""
    assert contiguous_rows(1024, 8) == 2048 and contiguous_rows(100, 4, top_k=8, align_m=64) == 1088
    [build] = gemm_builds([GemmShape("contiguous", 256, 128, 8)], 1024, mode="relaxed", module="fake_deep_gemm",
                          device="cpu")
    assert max(build.run.ms) == 2048 and set(range(128, 2049, 128)) <= set(build.run.ms)
    with pytest.raises(ValueError, match="top_k=0"):
        deep_gemm_builds([GemmShape("dense", 256, 128)], 8, top_k=0, device="cpu")


def test_builds_dedup_by_shape_and_m_set():
    shapes = [GemmShape("dense", 512, 256)] * 2 + [GemmShape("dense", 256, 512)]
    builds = deep_gemm_builds(shapes, 100, mode="full", module="fake_deep_gemm", device="cpu")
    assert all(b.library == "deep_gemm" and not b.uses_gpu for b in builds)
    assert [b.describe() for b in builds] == [
        "fp8_gemm_nt E=1 N=512 K=256 x 100 M", "fp8_gemm_nt E=1 N=256 K=512 x 100 M",
        "get_mn_major_tma_aligned_tensor x 2", "get_mn_major_tma_aligned_tensor x 4"]  # a copy per scales' width
    again = gemm_builds(shapes[:1], 100, mode="relaxed", module="fake_deep_gemm", device="cpu")
    assert again[0].key != builds[0].key  # another M set is another build


def test_ranks_on_gpus_of_one_kind_share_a_build():
    """The node claims key on the build's key: with the GPU's index in it, every rank of a tensor-parallel job
    would compile every kernel again."""
    shape = [GemmShape("dense", 512, 256)]
    first, second = (deep_gemm_builds(shape, 100, module="fake_deep_gemm", device=device)[0]
                     for device in ("cpu:0", "cpu:1"))
    assert first.key == second.key and first.artifact.identity() == second.artifact.identity()
    assert (first.run.device, second.run.device) == ("cpu:0", "cpu:1")  # each rank runs on its own


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_weights_on_meta_build_for_the_current_gpu():
    model = nn.Module()
    model.w = nn.Parameter(torch.empty(512, 256, dtype=torch.float8_e4m3fn, device="meta"), requires_grad=False)
    family = DeepGemmFamily(max_tokens=lambda config: 64, module="fake_deep_gemm")
    builds = family.builds(model, None)
    assert {type(build.run) for build in builds} == {GemmRun, ScalesRun}  # the GEMMs and their scales' copy
    device = f"cuda:{torch.cuda.current_device()}"
    assert all(build.uses_gpu and build.run.device == device for build in builds)


@pytest.mark.parametrize("make, error", [
    (lambda: DeepGemmFamily(max_tokens=8192), r"DeepGemmFamily\(max_tokens=8192\).*max_tokens=lambda config"),
    (lambda: DeepGemmFamily(max_tokens=lambda c: 8, top_k=8), r"DeepGemmFamily\(top_k=8\).*top_k=lambda config"),
    (lambda: DeepGemmFamily(max_tokens=lambda c: 8, grouped="masked"),
     r"DeepGemmFamily\(grouped='masked'\).*grouped=\('masked',\)"),
    (lambda: find_gemm_shapes(MoE(), grouped=("dense",)), r"find_gemm_shapes\(grouped=\('dense',\)\)"),
    (lambda: deep_gemm_builds([(4096, 7168)], 64, module="fake_deep_gemm", device="cpu"),
     r"deep_gemm_builds\('deep_gemm'\) shapes: \(4096, 7168\) is not a GemmShape.*GemmShape\('dense', n, k\)"),
    (lambda: deep_gemm_builds([GemmShape("dense", 512, 256)], None, module="fake_deep_gemm", device="cpu"),
     r"deep_gemm_builds\('deep_gemm'\) max_tokens=None: expected an int"),
    (lambda: m_values(100, 512, "ful"), r"m_values mode='ful': expected one of \['relaxed', 'full', 'off'\]"),
    (lambda: DeepGemmFamily(max_tokens=lambda c: 8, grouped=True), r"DeepGemmFamily\(grouped=True\)"),
])
def test_bad_arguments_name_the_call_the_argument_and_the_fix(make, error):
    with pytest.raises((TypeError, ValueError), match=error):
        make()


def test_the_family_takes_any_sequence_of_layouts_and_integer_token_counts():
    assert DeepGemmFamily(max_tokens=len, grouped=(kind for kind in ["masked"])).grouped == ("masked",)
    assert DeepGemmFamily(max_tokens=len, grouped=["contiguous", "masked"]).grouped == ("contiguous", "masked")
    [build] = gemm_builds([GemmShape("dense", 512, 256)], torch.tensor(64), module="fake_deep_gemm", device="cpu")
    assert max(build.run.ms) == 64


def test_deep_gemms_cache_is_found_where_its_compiler_puts_it(monkeypatch, tmp_path):
    from buildops.backends.deep_gemm.versions import cache_root

    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    assert cache_root() == tmp_path / "dg"
    monkeypatch.delenv("DG_JIT_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".deep_gemm"
    monkeypatch.delenv("HOME")  # DeepGEMM then writes under the working directory; no error in a serving call
    assert cache_root() == Path(".deep_gemm")


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_every_shape_runs_at_every_m(calls, executor):
    shapes = [GemmShape("dense", 256, 128), GemmShape("contiguous", 256, 128, 3), GemmShape("masked", 128, 256, 2)]
    with settings.scope(executor=executor), build_pass("warmup"):
        for build in deep_gemm_builds(shapes, 20, mode="full", module="fake_deep_gemm", device="cpu"):
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    seen = calls()
    assert report().total("failed") == 0
    dense = sorted(c["m"] for c in seen if c["fn"] == "fp8_fp4_gemm_nt")
    assert dense == list(range(1, 21))
    # the contiguous kind's M is its padded rows: 20 tokens over 3 experts take up to 20 + 3 x 127 rows, so every
    # multiple of 128 up to 512 runs, once each
    contiguous = [c for c in seen if c["fn"] == "m_grouped_fp8_fp4_gemm_nt_contiguous"]
    assert [(c["m"], c["e"]) for c in contiguous] == [(128, 3), (256, 3), (384, 3), (512, 3)]
    masked = sorted(c["m"] for c in seen if c["fn"] == "m_grouped_fp8_fp4_gemm_nt_masked")
    assert masked == list(range(1, 21))
    pids = {c["pid"] for c in seen}
    assert (pids == {os.getpid()}) == (executor == "threads")  # processes: the runs happened elsewhere


def test_a_worker_gives_its_cached_gpu_memory_back_after_each_run(fake, monkeypatch):
    """In a worker process, what the operands took stays in torch's cache unless emptied, out of reach of the
    engine and of the gate's checks elsewhere. Here in-process, with the GPU faked: the run, then the emptying."""
    import contextlib

    from buildops.backends.deep_gemm import runs as deep_gemm
    from buildops.backends.deep_gemm.state import deep_gemm_state

    monkeypatch.setattr(deep_gemm_state, "worker_defaults", {})  # what a worker notes of its settings
    events = []
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("emptied"))
    monkeypatch.setattr(deep_gemm, "run_admitted", lambda *args: events.append("ran"))
    shape = GemmShape("dense", 256, 128)
    deep_gemm.in_worker(deep_gemm.run_shape, "cuda:0", "fake_deep_gemm", shape, [1, 2], "cuda:0", 0, ())
    assert events == ["ran", "emptied"]
    deep_gemm.in_worker(deep_gemm.run_shape, "cpu", "fake_deep_gemm", shape, [1, 2], "cpu", 0, ())
    assert events == ["ran", "emptied", "ran"]  # nothing to give back from the CPU


def test_a_family_queues_builds_when_the_model_is_created(calls):
    family = register_family(DeepGemmFamily(max_tokens=lambda config: config["max_tokens"], module="fake_deep_gemm"))
    try:
        with settings.scope(executor="threads"):
            futures = model_created(MoE(), {"max_tokens": 8})  # no pass: straight to the builder
            assert len(futures) == 3 + 2 and buildops.join(timeout=WAIT)  # and the scales' copies: K 256 and 512
            # the experts' rows: every multiple of 128 up to 8 tokens and 4 experts' padding (640 rows)
            assert len(calls()) == 2 * len(m_values(8, 512)) + contiguous_rows(8, 4) // 128 + 2
            with buildops.rehearsal("startup"):
                assert len(model_created(MoE(), {"max_tokens": 16})) == 3 + 2
            assert buildops.join(timeout=WAIT)
            assert model_created(nn.Linear(4, 4), {"max_tokens": 8}) == []  # not recognised: nothing queued
    finally:
        unregister_family(family)


def test_the_memory_gate_admits_what_fits_and_runs_fewer_at_once():
    free = {"bytes": 3 << 20}
    gate = MemoryGate(free=lambda device: free["bytes"], device_id=lambda device: "gpu-under-test")
    cuda = torch.device("cuda", 0)
    with settings.scope(gpu_reserve_mb=1):
        first = gate.allocate(cuda, 1 << 20, lambda: "operands", "first")
        assert first == "operands"
        free["bytes"] = 1 << 20  # the first build's operands now take memory
        import threading
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (gate.allocate(cuda, 1 << 20, lambda: None, "second"),
                                                  done.set()))
        waiter.start()
        assert not done.wait(0.3) and gate.waits >= 1  # waits while the first holds its operands
        free["bytes"] = 3 << 20
        gate.release(cuda)
        assert done.wait(WAIT)
        gate.release(cuda)
        with pytest.raises(NotEnoughGpuMemory, match=r"second: dummy operands need 4 MiB, 3 MiB is free and "
                                                     r"BUILDOPS_GPU_RESERVE_MB keeps 1 MiB"):
            gate.allocate(cuda, 4 << 20, lambda: None, "second")  # nothing else holds memory: it never fits
        # a reserve given by the build (a DeepGEMM build carries the one its process had) wins over the setting
        with pytest.raises(NotEnoughGpuMemory, match="BUILDOPS_GPU_RESERVE_MB keeps 3 MiB"):
            gate.allocate(cuda, 1 << 20, lambda: None, "third", reserve_mb=3)


def test_the_memory_gate_counts_each_gpu_apart_without_node_locks():
    """Only builds on the same GPU can free its memory: one that never fits fails at once, whatever runs on
    another GPU."""
    gate = MemoryGate(free=lambda device: 2 << 20, device_id=lambda device: f"gpu-{device.index}")
    import concurrent.futures

    with settings.scope(node_locks="off"):
        assert gate.allocate(torch.device("cuda", 0), 1 << 20, lambda: "operands", "first", reserve_mb=0)
        with concurrent.futures.ThreadPoolExecutor(1) as thread:  # a thread: a gate that waits fails the test
            second = thread.submit(gate.allocate, torch.device("cuda", 1), 4 << 20, lambda: None, "second",
                                   reserve_mb=0)
            try:
                with pytest.raises(NotEnoughGpuMemory, match="second"):
                    second.result(timeout=WAIT / 2)
                assert gate.waits == 0
            finally:
                gate.release(torch.device("cuda", 0))  # lets a gate that waited go on, so the thread ends


def test_a_failed_build_run_drops_its_operands():
    """The error stays in the report, and its traceback keeps the frames that ran: they must not keep the dummy
    operands (GiB on a GPU) alive."""
    import weakref

    from buildops._runtime.gpu import run_admitted

    class Operands:
        pass

    made = []

    def make():
        operands = Operands()
        made.append(weakref.ref(operands))
        return operands

    def run(operands):
        raise ValueError("the kernel failed")

    with pytest.raises(ValueError, match="the kernel failed") as failure:
        run_admitted(torch.device("cpu"), 0, make, run, "failing")
    assert failure.value.__traceback__ is not None and made[0]() is None


def test_the_memory_gate_follows_the_node_locks_setting(tmp_path, monkeypatch):
    gate = MemoryGate(free=lambda device: 2 << 20, device_id=lambda device: "gpu-under-test")
    cuda = torch.device("cuda", 0)
    for name in ("first", "second"):
        monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / name))
        gate.allocate(cuda, 1 << 20, lambda: None, name, reserve_mb=0)
        gate.release(cuda)
        assert (tmp_path / name / "gpu-gpu-under-test.admit.lock").exists()


def test_a_forked_child_neither_keeps_the_parents_gpu_locks_nor_inherits_its_builds(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / "locks"))
    gate = MemoryGate(free=lambda device: 2 << 20, device_id=lambda device: "gpu-under-test")
    gate.POLL_SECONDS = 0.05
    cuda = torch.device("cuda", 0)
    gate.allocate(cuda, 1 << 20, lambda: None, "parent's", reserve_mb=0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (os.fork runs the gate's fork hook): none of the parent's builds is its own
        os.write(write, b"fresh" if gate._holding == {} and gate._held == {} else b"inherited")
        time.sleep(WAIT)  # alive, holding whatever it inherited, while the parent goes on
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 64) == b"fresh"
        gate.release(cuda)  # the parent's build is done: with the child alive, nothing holds operands now
        began = time.monotonic()
        with pytest.raises(NotEnoughGpuMemory):  # so one that never fits fails at once, not when the child ends
            gate.allocate(cuda, 4 << 20, lambda: None, "parent's second", reserve_mb=0)
        assert time.monotonic() - began < WAIT / 2
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


HOLDER = """
import sys
from pathlib import Path
from buildops._runtime.gpu import _NodeHolders
_NodeHolders(Path(sys.argv[1]), "gpu-under-test").hold()  # as a build in another process holds its operands
print("holding", flush=True)
sys.stdin.read()
"""


def test_the_memory_gate_waits_for_other_processes_and_not_for_dead_ones(tmp_path, monkeypatch):
    import subprocess
    import sys
    import threading

    from filelock import FileLock, Timeout

    locks = tmp_path / "locks"
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    locks.mkdir()
    cuda = torch.device("cuda", 0)
    admit = FileLock(locks / "gpu-gpu-under-test.admit.lock", thread_local=False)

    def make():  # another process could not check free memory now: the allocation is under the node's lock
        with pytest.raises(Timeout):
            admit.acquire(timeout=0)
        return "operands"

    gate = MemoryGate(free=lambda device: 2 << 20, device_id=lambda device: "gpu-under-test")
    gate.POLL_SECONDS = 0.05
    assert gate.allocate(cuda, 1 << 20, make, "first", reserve_mb=0) == "operands"
    gate.release(cuda)
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(locks)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "holding\n"
        outcome = []
        waiter = threading.Thread(target=lambda: outcome.append(pytest.raises(
            NotEnoughGpuMemory, gate.allocate, cuda, 4 << 20, lambda: None, "second", reserve_mb=0)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and gate.waits >= 1  # it does not fit, but the other process may free memory
        other.kill()  # and dies holding: the operating system drops its lock
        other.wait()
        waiter.join(WAIT)
        assert not waiter.is_alive() and "second: dummy operands need 4 MiB" in str(outcome[0].value)
    finally:
        other.kill()
        other.wait()


# -- the fake follows DeepGEMM ------------------------------------------------------------------------------------

@pytest.fixture
def fake(monkeypatch, tmp_path):
    """The fake DeepGEMM with a cache of its own, its process-global settings put back after the test."""
    import fake_deep_gemm

    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "dg"))
    knobs = dict(fake_deep_gemm._knobs)
    yield fake_deep_gemm
    fake_deep_gemm._knobs.update(knobs)


def kernels(tmp_path, name=None):
    """The fake's cache entries under tmp_path/dg: {entry: its config}, of one kernel or all."""
    found = {}
    for entry in (tmp_path / "dg" / "cache").glob("kernel.*"):
        config = json.loads((entry / "kernel.cu").read_text().splitlines()[0].removeprefix("// config: "))
        if name is None or config["kernel"] == name:
            found[entry.name] = config
    return found


def dense_operands(m, n, k):
    kb, nb = -(-k // 128), -(-n // 128)
    fp8 = torch.float8_e4m3fn
    return ((torch.zeros(m, k).to(fp8), torch.ones(m, kb)), (torch.zeros(n, k).to(fp8), torch.ones(nb, kb)),
            torch.empty(m, n, dtype=torch.bfloat16))


def test_the_fake_has_deep_gemms_signatures_and_names(fake):
    import inspect

    def parameters(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    empty = inspect.Parameter.empty
    recipes = [("recipe", None), ("recipe_a", None), ("recipe_b", None), ("compiled_dims", "nk"),
               ("disable_ue8m0_cast", False)]
    assert parameters(fake.fp8_gemm_nt) == [("a", empty), ("b", empty), ("d", empty), ("c", None), *recipes]
    assert parameters(fake.m_grouped_fp8_gemm_nt_contiguous) == [
        ("a", empty), ("b", empty), ("d", empty), ("grouped_layout", empty), *recipes, ("use_psum_layout", False),
        ("ensure_zero_padding", True), ("expected_m_for_psum_layout", None)]
    assert parameters(fake.m_grouped_fp8_gemm_nt_masked) == [
        ("a", empty), ("b", empty), ("d", empty), ("masked_m", empty), ("expected_m", empty), *recipes]
    # DeepGEMM binds the fp8 names to its fp8_fp4 functions
    assert fake.fp8_gemm_nt.__name__ == "fp8_fp4_gemm_nt"
    assert fake.m_grouped_fp8_gemm_nt_contiguous is fake.m_grouped_fp8_fp4_gemm_nt_contiguous
    assert fake.m_grouped_fp8_gemm_nt_masked is fake.m_grouped_fp8_fp4_gemm_nt_masked


def test_the_fake_checks_operands_as_deep_gemms_sm90_kernels_do(fake, tmp_path):
    fp8 = torch.float8_e4m3fn
    (a, sfa), (b, sfb), d = dense_operands(64, 256, 256)
    fake.fp8_gemm_nt((a, sfa), (b, sfb), d)
    bad = {
        "K-major": lambda: fake.fp8_gemm_nt((a.T.contiguous().T, sfa), (b, sfb), d),
        "N-major": lambda: fake.fp8_gemm_nt((a, sfa), (b, sfb), torch.empty(256, 64, dtype=torch.bfloat16).T),
        "rows": lambda: fake.fp8_gemm_nt((a, sfa[:32]), (b, sfb), d),
        "columns": lambda: fake.fp8_gemm_nt((a, sfa), (b, torch.ones(2, 3)), d),
        "does not accumulate": lambda: fake.fp8_gemm_nt((a, sfa), (b, sfb), d, c=d),
        "writes bf16": lambda: fake.fp8_gemm_nt((a, sfa), (b, sfb), torch.empty(64, 256)),
        "fp32": lambda: fake.fp8_gemm_nt((a, sfa.double()), (b, sfb), d),
    }
    for what, call in bad.items():
        with pytest.raises(RuntimeError, match=what):
            call()
    fake.fp8_gemm_nt((a, sfa), (torch.zeros(256, 256).to(fp8), torch.ones(256, 2)), torch.empty(64, 256),
                     c=torch.zeros(64, 256), recipe=(1, 1, 128))  # the 1D1D kernel takes fp32 and accumulates
    before = set(kernels(tmp_path))
    fake.fp8_gemm_nt((a[:0], sfa[:0]), (b, sfb), d[:0])  # empty: returns before compiling anything
    assert set(kernels(tmp_path)) == before

    experts = (torch.zeros(2, 256, 256).to(fp8), torch.ones(2, 2, 2))
    layout = torch.tensor([0] * 100 + [-1] * 28 + [1] * 128, dtype=torch.int32)  # padding rows are -1
    a256, sfa256 = torch.zeros(256, 256).to(fp8), torch.ones(256, 2)
    d256 = torch.empty(256, 256, dtype=torch.bfloat16)
    fake.m_grouped_fp8_gemm_nt_contiguous((a256, sfa256), experts, d256, layout)
    for what, grouped_layout in {"int32": layout.long(), "contiguous": torch.stack([layout, layout], 1)[:, 0],
                                 r"\[-1, 2\)": layout.clone().fill_(2),
                                 "not a multiple of 128": torch.tensor([0] * 64 + [1] * 192, dtype=torch.int32)
                                 }.items():
        with pytest.raises(RuntimeError, match=what):
            fake.m_grouped_fp8_gemm_nt_contiguous((a256, sfa256), experts, d256, grouped_layout)
    # the rule is the alignment in force, not M % 128
    fake.set_mk_alignment_for_contiguous_layout(64)
    fake.m_grouped_fp8_gemm_nt_contiguous((a256[:192], sfa256[:192]), experts, d256[:192],
                                          torch.tensor([0] * 64 + [1] * 100 + [-1] * 28, dtype=torch.int32))

    a3, sfa3, d3 = torch.zeros(2, 32, 256).to(fp8), torch.ones(2, 32, 2), torch.empty(2, 32, 256, dtype=torch.bfloat16)
    masked_m = torch.tensor([32, 7], dtype=torch.int32)
    fake.m_grouped_fp8_gemm_nt_masked((a3, sfa3), experts, d3, masked_m, 16)
    for what, args in {"shape \\(2,\\)": (masked_m[:1], 16), "int32": (masked_m.long(), 16),
                       "positive": (masked_m, 0)}.items():
        with pytest.raises(RuntimeError, match=what):
            fake.m_grouped_fp8_gemm_nt_masked((a3, sfa3), experts, d3, *args)


def test_the_fakes_kernels_are_named_as_deep_gemms_and_many_ms_share_one(fake, tmp_path, calls):
    shapes = [GemmShape("dense", 256, 384), GemmShape("contiguous", 256, 384, 3), GemmShape("masked", 256, 384, 2)]
    with settings.scope(executor="threads"):
        for build in deep_gemm_builds(shapes, 300, mode="full", module="fake_deep_gemm", device="cpu"):
            build.run()
    # contiguous: each multiple of 128 rows; and the scales' copy
    assert len(calls()) == 300 + contiguous_rows(300, 3) // 128 + 300 + 1
    # a kernel per tiling DeepGEMM's heuristics pick, each shared by many Ms
    for name, kind, ms, groups in [("sm90_fp8_gemm_1d2d", "dense", range(1, 301), 1),
                                   ("sm90_m_grouped_fp8_gemm_contiguous_1d2d", "contiguous", range(128, 769, 128), 3),
                                   ("sm90_fp8_m_grouped_gemm_masked_1d2d", "masked", range(1, 301), 2)]:
        made = {(c["block_m"], c["block_n"], *c["cluster"]) for c in kernels(tmp_path, name).values()}
        picked = tilings(kind, ms, 256, 384, groups)
        assert made == {(t.block_m, t.block_n, t.cluster_m, t.cluster_n) for t in picked} and len(made) < len(ms)
    # the row-major scales of the activations: transposed by one kernel per ceil(K / 128), the scales' copy's build;
    # the GEMMs' builds give theirs MN-major
    assert [c["sf_k"] for c in kernels(tmp_path, "transpose_fp32").values()] == [3]
    assert len(kernels(tmp_path)) == len(tilings("dense", range(1, 301), 256, 384)) + 1 + 2 + 1
    assert all(name.startswith(f"kernel.{c['kernel']}.") for name, c in kernels(tmp_path).items())


@pytest.fixture
def sm90(monkeypatch):
    """Builds made as for an SM90 GPU, which the fake stands for: DeepGEMM's choice of kernel is predicted."""
    from buildops.backends.deep_gemm import builds

    monkeypatch.setattr(builds, "device_arch", lambda device: "sm_90")


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_predicted_builds_run_once_per_kernel_and_serving_at_any_m_compiles_nothing(fake, sm90, tmp_path, calls,
                                                                                   executor):
    shapes = [GemmShape("dense", 256, 384), GemmShape("contiguous", 256, 384, 3), GemmShape("masked", 256, 384, 2)]
    rows = contiguous_rows(300, 3, top_k=2)
    every_m = {"dense": range(1, 301), "contiguous": range(128, rows + 1, 128), "masked": range(1, 301)}
    builds = deep_gemm_builds(shapes, 300, mode="relaxed", module="fake_deep_gemm", device="cpu", top_k=2)
    gemms = [b for b in builds if isinstance(b.run, GemmRun)]
    picked = {s.kind: tilings(s.kind, every_m[s.kind], s.n, s.k, s.experts) for s in shapes}
    # a build per tiling, running the smallest M of it: every M up to the bound, not only the relaxed sweep's
    assert sorted((b.run.shape.kind, b.run.ms) for b in gemms) == sorted(
        (kind, (ms[0],)) for kind, by_tiling in picked.items() for ms in by_tiling.values())
    assert any("for M 1-" in b.describe() for b in gemms) and any("for rows 128-" in b.describe() for b in gemms)
    with settings.scope(executor=executor), build_pass("warmup"):
        for build in builds:
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    assert report().total("failed") == 0
    assert len([c for c in calls() if c["fn"] != "get_mn_major_tma_aligned_tensor"]) == len(gemms)
    made = set(kernels(tmp_path))
    assert len(made) == len(gemms) + 1  # and the scales' copy, K / 128 = 3

    # serving, with row-major scales as most engines pass them: every M compiles nothing
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for m in every_m["dense"]:
        fake.fp8_gemm_nt(*dense_operands(m, 256, 384))
    experts = (torch.zeros(3, 256, 384).to(fp8), torch.ones(3, 2, 3))
    for m in every_m["contiguous"]:
        layout = torch.arange(m, dtype=torch.int32) // 128 % 3
        fake.m_grouped_fp8_gemm_nt_contiguous((torch.zeros(m, 384).to(fp8), torch.ones(m, 3)), experts,
                                              torch.empty(m, 256, dtype=bf16), layout)
    masked, two_experts = (torch.zeros(2, 320, 384).to(fp8), torch.ones(2, 320, 3)), (experts[0][:2], experts[1][:2])
    for m in every_m["masked"]:
        fake.m_grouped_fp8_gemm_nt_masked(masked, two_experts, torch.empty(2, 320, 256, dtype=bf16),
                                          torch.tensor([m, m // 2], dtype=torch.int32), m)
    serving = calls()[len(gemms) + 1:]
    assert len(serving) == 300 + len(every_m["contiguous"]) + 300
    assert not any(call["compiled"] for call in serving) and set(kernels(tmp_path)) == made


def test_predicted_builds_start_with_the_biggest_tiles_and_end_with_the_scales_copies(fake, sm90, monkeypatch):
    # A bigger tile's kernel compiles longer (docs/decisions/0026): queued first, the longest do not come last,
    # where one would run alone while the other workers idle.
    shapes = [GemmShape("dense", 256, 384), GemmShape("dense", 4096, 7168), GemmShape("contiguous", 256, 384, 3)]
    builds = deep_gemm_builds(shapes, 1024, module="fake_deep_gemm", device="cpu", top_k=2)
    gemms = [b.run for b in builds if isinstance(b.run, GemmRun)]
    assert [type(b.run) for b in builds] == [GemmRun] * len(gemms) + [ScalesRun] * 2  # K / 128: 3 and 56
    areas = [run.tiling.block_m * run.tiling.block_n for run in gemms]
    assert areas == sorted(areas, reverse=True) and areas[0] > areas[-1]
    monkeypatch.setattr(fake, "__version__", "2.7.0")  # not predicted: one sweep per shape, as listed
    sweeps = deep_gemm_builds(shapes, 1024, mode="relaxed", module="fake_deep_gemm", device="cpu", top_k=2)
    assert [b.run.shape for b in sweeps if isinstance(b.run, GemmRun)] == shapes


def test_a_deep_gemm_whose_choice_is_not_reproduced_runs_every_m_of_the_sweep(fake, sm90, monkeypatch):
    monkeypatch.setattr(fake, "__version__", "2.7.0")
    [build] = [b for b in deep_gemm_builds([GemmShape("dense", 256, 384)], 300, mode="relaxed",
                                           module="fake_deep_gemm", device="cpu") if isinstance(b.run, GemmRun)]
    assert build.run.ms == m_values(300, 256, "relaxed") and build.describe().endswith(f"x {len(build.run.ms)} M")


def test_a_deep_gemm_not_yet_imported_is_predicted_from_the_version_in_its_source(fake, sm90, monkeypatch, tmp_path):
    # An engine's pass may come before anything of it imports DeepGEMM, which is on its path without a distribution's
    # metadata: its version is read from its source, and the import is left to the workers.
    from buildops.backends.deep_gemm import versions

    monkeypatch.delitem(sys.modules, "fake_deep_gemm")
    gemms = [b for b in deep_gemm_builds([GemmShape("dense", 256, 384)], 300, mode="relaxed", module="fake_deep_gemm",
                                         device="cpu") if isinstance(b.run, GemmRun)]
    assert "fake_deep_gemm" not in sys.modules
    assert {b.run.ms for b in gemms} == {(ms[0],) for ms in tilings("dense", range(1, 301), 256, 384).values()}

    monkeypatch.syspath_prepend(str(tmp_path))
    for name, source in {"dg_quoted": b'__version__ = "2.6.1"  # public\n', "dg_none": b"VERSION = '2.6.1'\n",
                         "dg_binary": b"\xff\xfe"}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_bytes(source)
    assert [versions.library_version(name) for name in ("dg_quoted", "dg_none", "dg_binary", "dg_absent")] == [
        "2.6.1", "unknown", "unknown", "unknown"]
    assert not {"dg_quoted", "dg_none", "dg_binary"} & set(sys.modules)


def test_scales_deep_gemm_needs_not_transpose_compile_no_transpose(fake, tmp_path):
    (a, _), b, d = dense_operands(30, 256, 384)
    mn_major = torch.ones(3, 32).T[:30]  # MN-major, rows padded to a multiple of 4: TMA-aligned
    fake.fp8_gemm_nt((a, mn_major), b, d)
    assert list(kernels(tmp_path, "transpose_fp32")) == [] and len(kernels(tmp_path)) == 1


def test_operand_bytes_count_deep_gemms_copy_of_the_scales():
    kb = 3  # K = 384
    assert GemmShape("dense", 256, 384).operand_bytes(5) == (
        5 * 384 + 5 * kb * 4 + 8 * kb * 4 + 256 * 384 + 2 * kb * 4 + 5 * 256 * 2 + 4)
    masked = GemmShape("masked", 256, 384, 2)
    assert masked.operand_bytes(5) == (  # each expert's 5 rows in a buffer of 64, as DeepGEMM needs
        128 * 384 + 128 * kb * 4 + 128 * kb * 4 + 2 * (256 * 384 + 2 * kb * 4) + 128 * 256 * 2 + 2 * 4)
    contiguous = GemmShape("contiguous", 256, 384, 2)
    assert contiguous.operand_bytes(5, align_m=64) == (
        64 * 384 + 2 * 64 * kb * 4 + 2 * (256 * 384 + 2 * kb * 4) + 64 * 256 * 2 + 64 * 4)


# -- the engine's DeepGEMM settings in the workers -----------------------------------------------------------------

@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_builds_run_with_the_engines_deep_gemm_settings(fake, tmp_path, calls, executor):
    fake.set_num_sms(100)
    fake.set_mk_alignment_for_contiguous_layout(64)
    shapes = [GemmShape("dense", 256, 128), GemmShape("contiguous", 256, 128, 3)]
    builds = deep_gemm_builds(shapes, 100, mode="full", module="fake_deep_gemm", device="cpu")
    with settings.scope(executor=executor):
        for build in builds:
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    assert report().total("failed") == 0
    assert {c["num_sms"] for c in kernels(tmp_path, "sm90_fp8_gemm_1d2d").values()} == {100}
    [contiguous] = kernels(tmp_path, "sm90_m_grouped_fp8_gemm_contiguous_1d2d").values()
    assert (contiguous["block_m"], contiguous["num_sms"]) == (64, 100)
    # the rows follow the alignment: each expert's rows start at a multiple of 64, up to 100 tokens and 3 x 63
    # padding rows; the last block's tail is -1
    assert [c["m"] for c in calls() if c["fn"] == "m_grouped_fp8_fp4_gemm_nt_contiguous"] == [64, 128, 192, 256, 320]
    fake.set_num_sms(0)  # back to the default: other kernels, another build
    again = deep_gemm_builds(shapes[:1], 100, mode="full", module="fake_deep_gemm", device="cpu")
    assert again[0].key != builds[0].key and again[0].artifact.identity() != builds[0].artifact.identity()


def test_a_worker_puts_back_its_defaults_for_a_build_that_gives_none(fake, tmp_path, calls, monkeypatch):
    """A worker runs builds made under different settings in turn: one the engine gave no settings (it had not
    imported DeepGEMM) runs with the defaults, not with the previous build's."""
    from buildops.backends.deep_gemm import runs as deep_gemm
    from buildops.backends.deep_gemm.state import deep_gemm_state

    monkeypatch.setattr(deep_gemm_state, "worker_defaults", {})
    shape = GemmShape("dense", 256, 128)
    deep_gemm.in_worker(deep_gemm.run_shape, "cpu", "fake_deep_gemm", shape, [8], "cpu", 0, (("num_sms", 100),))
    deep_gemm.in_worker(deep_gemm.run_shape, "cpu", "fake_deep_gemm", shape, [8], "cpu", 0, ())
    assert sorted(c["num_sms"] for c in kernels(tmp_path, "sm90_fp8_gemm_1d2d").values()) == [100, 132]


def test_only_settings_changed_from_deep_gemms_defaults_are_taken(fake, monkeypatch):
    """At the defaults, the builds' keys are the same whether or not the process imported DeepGEMM, so that a node
    that did not (a build-only node) shares its builds with one that did."""
    import sys

    from buildops.backends.deep_gemm.knobs import engine_knobs

    def key():
        return deep_gemm_builds([GemmShape("dense", 256, 128)], 8, module="fake_deep_gemm", device="cpu")[0].key

    assert engine_knobs("fake_deep_gemm") == ()
    imported = key()
    with monkeypatch.context() as not_imported:
        not_imported.delitem(sys.modules, "fake_deep_gemm")
        assert engine_knobs("fake_deep_gemm") == () and key() == imported
    fake.set_tc_util(80)
    fake.set_mk_alignment_for_contiguous_layout(64)
    assert engine_knobs("fake_deep_gemm") == (("tc_util", 80), ("mk_alignment_for_contiguous_layout", 64))
    assert key() != imported
    monkeypatch.delattr(fake, "set_tc_util")  # a getter without its setter cannot be mirrored
    assert engine_knobs("fake_deep_gemm") == (("mk_alignment_for_contiguous_layout", 64),)


# -- identity ------------------------------------------------------------------------------------------------------

def test_the_identity_covers_deep_gemms_include_dir(fake, monkeypatch, tmp_path):
    from pathlib import Path

    from buildops.backends.deep_gemm import versions as deep_gemm_versions

    assert deep_gemm_versions.include_dir("fake_deep_gemm") == str(Path(fake.__file__).parent / "include")

    def identity():
        [build] = gemm_builds([GemmShape("dense", 256, 128)], 8, module="fake_deep_gemm", device="cpu")
        return build.artifact.identity()

    here = identity()
    monkeypatch.setattr(fake, "__file__", str(tmp_path / "elsewhere" / "fake_deep_gemm.py"))
    assert identity() != here  # another install path: DeepGEMM's hashes differ, so must the entries' identity


def test_nvcc_is_found_as_deep_gemm_finds_it(monkeypatch, tmp_path):
    from buildops.backends.deep_gemm import entries as deep_gemm_entries
    from buildops.backends.deep_gemm import versions as deep_gemm_versions

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9'\n")
    nvcc.chmod(0o755)
    for name in ("CUDA_HOME", "CUDA_PATH", "DG_JIT_NVCC_COMPILER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{nvcc.parent}:{os.environ['PATH']}")
    assert deep_gemm_versions.cuda_home() == str(tmp_path / "cuda")
    assert deep_gemm_entries._nvcc_version() == "Cuda compilation tools, release 12.9"
    monkeypatch.setenv("CUDA_PATH", "/opt/cuda-from-path-variable")
    assert deep_gemm_versions.cuda_home() == "/opt/cuda-from-path-variable"


# -- late compiles -------------------------------------------------------------------------------------------------

@pytest.fixture
def watched_fake(fake, monkeypatch):
    """The fake, watched for late compiles as ``deep_gemm`` is (the watcher is registered for that name)."""
    from buildops._core import extensions
    from buildops._core.state import core
    from buildops.backends.deep_gemm.late import note_module

    monkeypatch.setattr(core, "backends", dict(core.backends))
    extensions.register(extensions.Backend("fake_deep_gemm", "fake_deep_gemm", late_watchers=(
        "buildops.backends.deep_gemm.late:watch_late_compiles",)))
    note_module("fake_deep_gemm")  # as a build of it does
    return fake


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_deep_gemm_kernel_compiled_after_a_pass_is_a_late_compile(watched_fake, tmp_path, calls, executor):
    fake = watched_fake
    taken_early = fake.fp8_gemm_nt  # a reference taken before the watch: not watched
    with settings.scope(executor=executor), build_pass("warmup"):
        for build in deep_gemm_builds([GemmShape("dense", 256, 384)], 64, mode="relaxed", module="fake_deep_gemm",
                                      device="cpu"):
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    assert report().total("failed") == 0 and kernels(tmp_path)

    fake.fp8_gemm_nt(*dense_operands(20, 256, 384))  # an M inside the sweep: its kernel is there
    assert buildops.late_compiles() == []
    fake.fp8_gemm_nt(*dense_operands(20, 512, 384))  # another N: a kernel no build made
    [late] = buildops.late_compiles()
    assert (late.library, late.kernel, late.ops) == ("deep_gemm", "sm90_fp8_gemm_1d2d", ("deep_gemm",))
    assert late.variant in kernels(tmp_path, "sm90_fp8_gemm_1d2d") and "test_deep_gemm.py" in late.where
    assert calls()[-1]["compiled"] == [late.variant]

    taken_early(*dense_operands(20, 640, 384))
    assert len(buildops.late_compiles()) == 1
    with settings.scope(late_compile="error"), pytest.raises(buildops.LateCompileError, match="sm90_fp8_gemm_1d2d"):
        fake.fp8_gemm_nt(*dense_operands(20, 768, 384))
    buildops.testing.reset()  # the watch goes
    assert fake.fp8_gemm_nt is fake.fp8_fp4_gemm_nt and not hasattr(fake.fp8_gemm_nt, "__wrapped__")


def test_a_call_during_a_deep_gemm_build_reports_nothing(watched_fake, tmp_path):
    """An entry that appears while a build of this process runs may be the build's (which takes it)."""
    from buildops.backends.deep_gemm.entries import making_entries

    fake = watched_fake
    with build_pass("warmup"):
        pass
    assert fake.fp8_gemm_nt.__wrapped__ is fake.fp8_fp4_gemm_nt.__wrapped__  # each name wrapped
    with making_entries():
        fake.fp8_gemm_nt(*dense_operands(20, 256, 384))
    assert buildops.late_compiles() == [] and kernels(tmp_path)
    fake.fp8_gemm_nt(*dense_operands(20, 256, 512))  # none under way: a late compile, of the GEMM and transpose
    assert sorted(late.kernel for late in buildops.late_compiles()) == ["sm90_fp8_gemm_1d2d", "transpose_fp32"]


# -- the worker pool's size ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("free_before_mib, free_after_mib, held_after_mib, workers, context_mib", [
    (40_000, 39_300, 1_200, 12, 500),  # room for 76 more contexts: as many workers as builder threads
    (3_224, 2_524, 1_200, 4, 500),     # 1,500 MiB beyond the reserve: 3 more contexts
    (40_000, 40_000, 1_000, 12, 256),  # the engine freed memory meanwhile: a context taken at the floor, not at 0
    (1_300, 600, 1_200, 1, 500),       # less than the reserve left: the first worker alone
    (60_000, 59_500, 1_000, 12, None),  # room for 12 contexts of 4 GiB: every worker at once, none measured
])
def test_the_deep_gemm_pool_holds_as_many_contexts_as_free_memory_allows(monkeypatch, caplog, free_before_mib,
                                                                          free_after_mib, held_after_mib, workers,
                                                                          context_mib):
    """The first worker opens its CUDA context alone; what the driver's free memory lost, less what this process's
    torch allocated meanwhile, is a context's size, and the free memory left beyond the reserve sets how many
    more workers run."""
    from buildops.backends.deep_gemm import workers as deep_gemm_workers

    mib = 1 << 20
    readings = iter([(free_before_mib * mib, 1_000 * mib), (free_after_mib * mib, held_after_mib * mib)])
    monkeypatch.setattr(deep_gemm_workers, "_memory", lambda device: next(readings))

    class Pool:
        calls, limits = [], []

        def run(self, what, fn, *args, build=True):
            self.calls.append((what, fn, args, build))

        def limit(self, calls):
            self.limits.append(calls)

    monkeypatch.setattr(deep_gemm_workers, "pool", Pool())
    with settings.scope(threads=12, gpu_reserve_mb=1024), caplog.at_level("INFO", logger="buildops"):
        sizing = deep_gemm_workers.sized("cuda:0")
        assert deep_gemm_workers.sized("cuda:0") is sizing  # once while the pool runs
    assert Pool.limits == [workers] and f"up to {workers} DeepGEMM worker processes" in caplog.text
    if context_mib is None:
        assert sizing == deep_gemm_workers.Sizing(12, None, (60_000 - 1024) * mib) and Pool.calls == []
        assert "hold their contexts, whatever their size" in caplog.text
    else:
        assert (sizing.workers, sizing.context_bytes) == (workers, context_mib * mib) and Pool.calls == [
            ("a CUDA context", deep_gemm_workers.open_context, ("cuda:0",), False)]  # a probe, not a build
        assert f"takes {context_mib} MiB" in caplog.text
    buildops.testing.reset()
    assert deep_gemm_workers.deep_gemm_state.sizing is None


def test_a_worker_that_cannot_open_a_context_leaves_the_builds_one_at_a_time(monkeypatch, caplog):
    from buildops.backends.deep_gemm import workers as deep_gemm_workers

    monkeypatch.setattr(deep_gemm_workers, "_memory", lambda device: (1 << 30, 0))

    class Pool:
        limits = []

        def run(self, what, fn, *args, build=True):
            raise RuntimeError("CUDA error: out of memory")

        def limit(self, calls):
            self.limits.append(calls)

    monkeypatch.setattr(deep_gemm_workers, "pool", Pool())
    with settings.scope(threads=12), caplog.at_level("WARNING", logger="buildops"):
        assert deep_gemm_workers.sized("cuda:0") == deep_gemm_workers.Sizing(1) and Pool.limits == [1]
    assert "could not open a CUDA context on cuda:0 (RuntimeError: CUDA error: out of memory)" in caplog.text
    buildops.testing.reset()


def test_without_a_gpu_the_deep_gemm_pool_runs_a_build_per_builder_thread():
    from buildops.backends.deep_gemm import workers as deep_gemm_workers

    with settings.scope(threads=3):
        assert deep_gemm_workers.sized("cpu") == deep_gemm_workers.Sizing(3)
    buildops.testing.reset()


def test_the_deep_gemm_workers_stop_once_idle_and_start_again_for_a_later_build(fake, monkeypatch, calls):
    """Their CUDA contexts must not hold GPU memory into serving."""
    import time

    from buildops.backends.deep_gemm import workers as deep_gemm_workers

    monkeypatch.setattr(deep_gemm_workers, "IDLE_STOP_SECONDS", 0.2)
    first, second = (gemm_builds([GemmShape("dense", 256, k)], 4, mode="full", module="fake_deep_gemm",
                                 device="cpu")[0] for k in (128, 256))
    with settings.scope(executor="processes"):
        first.run()
        deadline = time.monotonic() + WAIT
        while deep_gemm_workers.pool.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not deep_gemm_workers.pool.started and deep_gemm_workers.deep_gemm_state.sizing is None  # sized anew
        second.run()
    pids = [{c["pid"] for c in calls() if c["k"] == k} for k in (128, 256)]
    assert all(len(p) == 1 for p in pids) and pids[0] != pids[1] and os.getpid() not in pids[0] | pids[1]


# -- manifests ----------------------------------------------------------------------------------------------------

def test_a_manifest_prebuilds_the_same_deep_gemm_kernels_on_a_machine_that_never_ran_the_pass(fake, sm90, tmp_path,
                                                                                            monkeypatch, calls):
    """``buildops prebuild`` of a pass's manifest, into an empty cache: the same kernels, each once; then nothing
    left to compile."""
    from buildops.manifests import load_manifest, prebuild, save_manifest

    shapes = [GemmShape("dense", 256, 384), GemmShape("contiguous", 256, 384, 3)]
    with settings.scope(executor="threads"), build_pass("warmup"):
        builds = deep_gemm_builds(shapes, 300, module="fake_deep_gemm", device="cpu", top_k=2)
        for build in builds:
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    made = set(kernels(tmp_path))
    manifest = save_manifest(tmp_path / "manifest.json")
    assert {e["label"] for e in load_manifest(manifest)} == {b.describe() for b in builds}
    assert all("not_prebuilt" not in e for e in load_manifest(manifest))
    from buildops.backends.deep_gemm.recipes import entry, prebuild_build
    gemms = [b.run for b in builds if isinstance(b.run, GemmRun)]
    again = [prebuild_build(entry(b)) for b in builds if isinstance(b.run, GemmRun)]
    assert all(run.tiling is not None for run in gemms)  # predicted: each build one kernel
    assert [b.run.tiling if isinstance(b, Build) else b for b in again] == [run.tiling for run in gemms]
    buildops.testing.reset()

    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    with settings.scope(executor="threads"):
        outcome = prebuild(manifest)
        assert (outcome.compiled, outcome.failed, outcome.refused) == (len(builds), [], [])
        assert {e.name for e in (tmp_path / "elsewhere" / "cache").iterdir()} == made
        buildops.testing.reset()
        ran = len(calls())
        assert prebuild(manifest).cached == len(builds) and len(calls()) == ran  # each its own kernel's: nothing run
    buildops.testing.reset()


@pytest.mark.parametrize("edit, refused", [
    ({"arch": "sm_100"}, "made for sm_100, and this machine's device is cpu"),
    ({"sms": 160}, "tiled for 160 multiprocessors, and this GPU has 132"),
    ({"version": "2.5.0", "identity": "0" * 64}, "another DeepGEMM install.*2.5.0 there, 2.6.1 here"),
    ({"module": "no_such_deep_gemm"}, "DeepGEMM is not installed here"),
])
def test_a_deep_gemm_entry_this_machine_would_build_otherwise_is_refused(fake, edit, refused):
    from buildops.backends.deep_gemm.recipes import entry, prebuild_build

    [build, *_] = deep_gemm_builds([GemmShape("dense", 256, 384)], 8, module="fake_deep_gemm", device="cpu")
    assert not isinstance(prebuild_build(entry(build)), str)  # as saved: built again here
    reason = prebuild_build({**entry(build), **edit})
    assert isinstance(reason, str) and re.search(refused, reason), reason


def test_a_predicted_build_whose_kernel_is_cached_runs_nothing_and_one_unread_runs_as_before(fake, sm90, tmp_path,
                                                                                              calls, monkeypatch):
    """A restart finds each predicted build's own entry in DeepGEMM's cache and starts no worker. Where DeepGEMM's
    code does not read as this version of buildops expects, a build takes the entries that appeared while it ran,
    as an unpredicted one does."""
    from buildops.backends.deep_gemm import versions, workers
    from buildops.backends.deep_gemm.state import deep_gemm_state

    def run_all():
        outcomes = []
        with settings.scope(executor="processes"):
            for build in deep_gemm_builds([GemmShape("dense", 256, 384)], 300, module="fake_deep_gemm", device="cpu"):
                outcomes.append(build.run())
        return outcomes

    first = run_all()
    ran = len(calls())
    assert ran == len(first) and all(o.cached is not True for o in first)
    workers.pool.shutdown()
    again = run_all()
    assert len(calls()) == ran and all(o.cached for o in again) and not workers.pool.started

    # Entries another install made (DeepGEMM's names hash its include path, nvcc and flags; the fake's do not)
    # read as the builds' kernels, but spare them no run: this one would load others.
    with monkeypatch.context() as elsewhere:
        elsewhere.setattr(fake, "__file__", str(tmp_path / "another" / "fake_deep_gemm.py"))
        assert len(run_all()) == len(first) and len(calls()) == 2 * ran
    workers.pool.shutdown()

    monkeypatch.setattr(versions, "entry_kernel", lambda entry: None)
    monkeypatch.setattr(deep_gemm_state, "entry_kernels", {})
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "fresh"))
    unread = run_all()
    assert len(calls()) == 3 * ran and all(o.cached is not True for o in unread)
    workers.pool.shutdown()
