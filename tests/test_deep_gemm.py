"""DeepGEMM builds by running, against a fake module with DeepGEMM's public signatures (DeepGEMM itself cannot be
installed on the CPU machines)."""

import json
import os

import pytest
import torch
from torch import nn

import buildops
from buildops import build_pass, model_created, register_family, report, settings, unregister_family
from buildops._runtime.gpu import MemoryGate, NotEnoughGpuMemory
from buildops.backends.deep_gemm import DeepGemmFamily, GemmShape, deep_gemm_builds, find_gemm_shapes, m_values

from conftest import WAIT


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


def test_builds_dedup_by_shape_and_m_set():
    shapes = [GemmShape("dense", 512, 256)] * 2 + [GemmShape("dense", 256, 512)]
    builds = deep_gemm_builds(shapes, 100, mode="full", module="fake_deep_gemm", device="cpu")
    assert len(builds) == 2 and all(b.library == "deep_gemm" and not b.uses_gpu for b in builds)
    again = deep_gemm_builds(shapes[:1], 100, mode="relaxed", module="fake_deep_gemm", device="cpu")
    assert again[0].key != builds[0].key  # another M set is another build


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_every_shape_runs_at_every_m(calls, executor):
    shapes = [GemmShape("dense", 256, 128), GemmShape("contiguous", 256, 128, 3), GemmShape("masked", 128, 256, 2)]
    with settings.scope(executor=executor), build_pass("warmup"):
        for build in deep_gemm_builds(shapes, 20, mode="full", module="fake_deep_gemm", device="cpu"):
            buildops._core.default.default_builder().submit(build)
        assert buildops.join(timeout=WAIT * 6)
    seen = calls()
    assert report().total("failed") == 0
    dense = sorted(c["m"] for c in seen if c["fn"] == "fp8_gemm_nt")
    assert dense == list(range(1, 21))
    contiguous = [c for c in seen if c["fn"] == "m_grouped_fp8_gemm_nt_contiguous"]
    assert len(contiguous) == 20 and {c["m"] for c in contiguous} == {128} and contiguous[0]["e"] == 3
    masked = sorted(c["m"] for c in seen if c["fn"] == "m_grouped_fp8_gemm_nt_masked")
    assert masked == list(range(1, 21))
    pids = {c["pid"] for c in seen}
    assert (pids == {os.getpid()}) == (executor == "threads")  # processes: the runs happened elsewhere


def test_a_worker_gives_its_cached_gpu_memory_back_after_each_run(monkeypatch):
    """In a worker process, what the operands took stays in torch's cache unless emptied, out of reach of the
    engine and of the gate's checks elsewhere. Here in-process, with the GPU faked: the run, then the emptying."""
    from buildops.backends import deep_gemm

    events = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("emptied"))
    monkeypatch.setattr(deep_gemm, "run_admitted", lambda *args: events.append("ran"))
    deep_gemm.run_shape_in_worker("fake_deep_gemm", GemmShape("dense", 256, 128), [1, 2], "cuda:0", 0)
    assert events == ["ran", "emptied"]
    deep_gemm.run_shape_in_worker("fake_deep_gemm", GemmShape("dense", 256, 128), [1, 2], "cpu", 0)
    assert events == ["ran", "emptied", "ran"]  # nothing to give back from the CPU


def test_a_family_queues_builds_when_the_model_is_created(calls):
    family = register_family(DeepGemmFamily(max_tokens=lambda config: config["max_tokens"], module="fake_deep_gemm"))
    try:
        with settings.scope(executor="threads"):
            futures = model_created(MoE(), {"max_tokens": 8})  # no pass: straight to the builder
            assert len(futures) == 3 and buildops.join(timeout=WAIT)
            assert len(calls()) == 2 * len(m_values(8, 512)) + len(m_values(8, 384))
            with buildops.rehearsal("startup"):
                assert len(model_created(MoE(), {"max_tokens": 16})) == 3
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
