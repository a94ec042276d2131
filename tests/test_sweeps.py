"""The rest of a sweep is listed after the pass's body (buildops/_core/sweeps.py): a rehearsal's thread replays only
the shapes its calls are made at; the rest lists on a background thread after a rehearsal, at the end of a build
pass, or at once where a call needs its shape first. Compiled for real (sm_90 through the compile-only driver on a
machine without a GPU)."""

import threading

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

import buildops
from buildops import BuildConfig, BuildState, DynamicSpec, build_pass, lists_kernels, rehearsal
from buildops.backends.triton import target

from conftest import WAIT

SWEEP = [1, 16, 64, 256]
replays = []  # (rows, thread name) of every replay of the op's host code
hold = {}  # rows -> an event the background lister waits for before it replays at those rows


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=SWEEP)), output="x")
def copy(x):
    """Launches its kernel in a replay; on this machine's CPU tensors (no GPU to launch on) it copies in torch."""
    rows, thread = x.shape[0], threading.current_thread().name
    if x.device.type != "meta":
        return x.clone()
    if thread == "buildops-lister" and rows in hold:
        assert hold[rows].wait(WAIT)
    replays.append((rows, thread))
    out = torch.empty_like(x)
    copy_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))  # a kernel per shape
    return out


@pytest.fixture(autouse=True)
def compile_only(tmp_path, monkeypatch):
    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    copy_kernel.device_caches.clear()
    replays.clear()
    yield
    for event in hold.values():
        event.set()
    hold.clear()


def states(op="copy"):
    builder = buildops._core.default.current_builder()
    return [] if builder is None else [record.state for record in builder._records.values() if op in record.ops]


def test_a_rehearsal_replays_only_its_calls_shapes_and_lists_the_rest_of_the_sweep_behind_it():
    with rehearsal("startup") as startup:
        copy(torch.zeros(64, 8))
        assert replays == [(64, "MainThread")]
    assert len(startup.called) == 1  # the one kernel of the called shape
    assert buildops.join(timeout=WAIT)
    assert sorted(replays[1:]) == [(1, "buildops-lister"), (16, "buildops-lister"), (256, "buildops-lister")]
    assert len(startup.futures) == len(SWEEP)
    assert set(states()) == {BuildState.BUILT}


def test_a_build_pass_lists_the_rest_at_its_end_while_the_called_shapes_build():
    with build_pass("warmup") as warmup:
        copy(torch.zeros(64, 8))
        assert len(warmup.futures) == 1  # queued at once: it compiles while the rest is listed
    assert replays == [(64, "MainThread"), (1, "MainThread"), (16, "MainThread"), (256, "MainThread")]
    assert all(future.done() for future in warmup.futures) and len(warmup.futures) == len(SWEEP)


def test_a_later_call_in_the_pass_lists_its_shape_at_once_and_ready_waits_for_it():
    with rehearsal("startup") as startup:
        copy(torch.zeros(64, 8))
        copy(torch.zeros(1, 8))  # same call signature, another swept shape: not a first call
        assert replays == [(64, "MainThread"), (1, "MainThread")]
    assert len(startup.called) == 2
    assert buildops.join(timeout=WAIT)
    assert sorted(rows for rows, _ in replays) == sorted(SWEEP)  # each shape replayed once


def test_a_serving_call_lists_its_own_shape_ahead_of_the_sweep_and_waits_for_its_build():
    hold[1] = threading.Event()  # the background lister stops at the first shape it lists
    with rehearsal("startup"):
        copy(torch.zeros(64, 8))
    out = copy(torch.ones(256, 8))  # serving, while the sweep has not reached 256 rows
    assert out.sum() == 256 * 8
    assert (256, "MainThread") in replays
    called, served = states()  # the rehearsal's kernel may still build: the call waited for its own only
    assert served is BuildState.BUILT
    hold[1].set()
    assert buildops.join(timeout=WAIT)
    assert sorted(rows for rows, _ in replays) == sorted(SWEEP)


def test_an_op_whose_own_shape_lists_nothing_lists_its_whole_sweep_in_the_body():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=SWEEP)), output="x")
    def small_only(x):
        rows = x.shape[0]
        replays.append((rows, threading.current_thread().name))
        if rows == 1:  # the kernel is launched for one row only: the call's 64 rows launch nothing
            copy_kernel[(1,)](x, torch.empty_like(x), x.numel(), BLOCK=1024)
        return x

    with rehearsal("startup"):
        small_only(torch.zeros(64, 8))
        # every shape now: whether the op lists anything at all is known at the pass's end
        assert sorted(set(replays)) == [(rows, "MainThread") for rows in SWEEP]


def test_a_rehearsal_that_raises_lists_no_more_of_its_sweeps():
    with pytest.raises(RuntimeError, match="model"):
        with rehearsal("startup"):
            copy(torch.zeros(64, 8))
            raise RuntimeError("the model failed")
    assert buildops.join(timeout=WAIT)
    assert replays == [(64, "MainThread")]


def test_a_shape_listed_after_a_shutdown_queues_nothing_and_makes_no_new_builder():
    """buildops.shutdown() while the lister replays a shape of an ended rehearsal: what that replay lists goes to
    no builder (a new one would start worker pools that no one stops before the exit)."""
    import time

    from buildops._core.sweeps import wait_for_sweeps

    hold[16] = threading.Event()
    with rehearsal("startup"):
        copy(torch.zeros(64, 8))
    deadline = time.monotonic() + WAIT
    while (1, "buildops-lister") not in replays and time.monotonic() < deadline:  # then it waits at 16 rows
        time.sleep(0.01)
    buildops.shutdown(timeout=WAIT)
    hold[16].set()  # the replay at 16 rows goes on, after the shutdown
    assert wait_for_sweeps(timeout=WAIT)
    assert buildops._core.default.current_builder() is None


def test_a_launch_builds_while_the_rest_of_its_replay_runs():
    """A replay can go on long after its launch (the first Python meta kernel of a process imports much of torch):
    the launch's build starts as it is recorded, and the listing then takes it as its own (listed once, not
    shared). A listing recorder starts nothing."""
    import time

    from buildops import settings
    from buildops.testing import record_listings

    built_during_the_replay = []
    patience = [0.5]  # a recorder builds nothing: its replay waits this long, for nothing

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[64])), output="x", name="launch_then_more")
    def launch_then_more(x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, x.numel(), BLOCK=64)
        deadline = time.monotonic() + patience[0]
        while BuildState.BUILT not in states("launch_then_more") and time.monotonic() < deadline:
            time.sleep(0.01)  # the rest of the host code, slow
        built_during_the_replay.append(states("launch_then_more"))
        return out

    with record_listings() as recorded:
        launch_then_more(torch.zeros(64, 8))
    assert len(recorded.of("launch_then_more")[0].builds) == 1 and built_during_the_replay == [[]]
    built_during_the_replay.clear()
    patience[0] = WAIT
    with settings.scope(executor="threads"), build_pass("warmup"):
        launch_then_more(torch.zeros(64, 8))
    assert built_during_the_replay == [[BuildState.BUILT]]
    [stats] = [s for s in buildops.report().ops if s.op == "launch_then_more"]
    assert (stats.listed, stats.shared, stats.built) == (1, 0, 1)
