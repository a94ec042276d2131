import logging
import sys
import threading
import time

import pytest
import torch

import buildops
from buildops import BuildState, build_pass, rehearsal, report, settings
from buildops._core.default import current_builder

from conftest import WAIT, op_listing


def in_thread(fn):
    """Start fn on a thread; returns the thread and a dict that holds its result."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", fn()))
    thread.start()
    return thread, result


def test_rehearsal_leaves_builds_running_and_join_waits(runs):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    start = time.perf_counter()
    with rehearsal("startup"):
        op(torch.empty(4, 3))
    assert time.perf_counter() - start < WAIT / 2  # did not wait for the held build
    assert runs.started.wait(WAIT)
    assert current_builder().state(("op", 3)) is BuildState.BUILDING
    assert buildops.join(timeout=0.2) is False
    gate.set()
    assert buildops.join(timeout=WAIT) is True
    assert current_builder().state(("op", 3)) is BuildState.BUILT


def test_build_pass_joins_at_its_end(runs):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)

    def run_pass():
        with build_pass("warmup"):
            op(torch.empty(4, 3))
        return current_builder().state(("op", 3))

    thread, result = in_thread(run_pass)
    thread.join(0.3)
    assert thread.is_alive()
    gate.set()
    thread.join(WAIT)
    assert result["value"] is BuildState.BUILT


def test_join_gpu_only_and_per_op(runs):
    gpu_gate, cpu_gate = threading.Event(), threading.Event()
    attention = op_listing(runs, name="attention.prefill", gate=gpu_gate, uses_gpu=True)
    norm = op_listing(runs, name="norm", gate=cpu_gate)
    with settings.scope(threads=2), rehearsal("startup"):
        attention(torch.empty(4, 2))
        norm(torch.empty(4, 2))
    assert buildops.join(gpu_only=True, timeout=0.2) is False
    gpu_gate.set()
    assert buildops.join(gpu_only=True, timeout=WAIT) is True
    assert buildops.join(op="attention", timeout=WAIT) is True   # by prefix
    assert buildops.join(op="norm", timeout=0.2) is False
    assert buildops.join(timeout=0.2) is False
    cpu_gate.set()
    assert buildops.join(op="norm", timeout=WAIT) is True


def test_nested_passes_join_once_at_the_outermost(runs):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    inner_done = threading.Event()

    def run_passes():
        with build_pass("outer"):
            with build_pass("inner"):
                op(torch.empty(4, 3))
            inner_done.set()  # the inner pass ended without waiting for the held build
        return current_builder().state(("op", 3))

    thread, result = in_thread(run_passes)
    assert inner_done.wait(WAIT)
    thread.join(0.3)
    assert thread.is_alive()  # the outer one waits
    gate.set()
    thread.join(WAIT)
    assert result["value"] is BuildState.BUILT


def test_nested_rehearsal_in_a_build_pass_defers_to_it(runs):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    with rehearsal("outer"):
        with build_pass("inner"):  # the outermost decides: no join here
            op(torch.empty(4, 3))
    assert current_builder().state(("op", 3)) in (BuildState.QUEUED, BuildState.BUILDING)
    gate.set()


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_raising_body_cancels_its_unstarted_builds(runs, error):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    with settings.scope(threads=1), pytest.raises(error):
        with build_pass("warmup"):
            for n in range(1, 6):
                op(torch.empty(4, n))
                runs.started.wait(WAIT)  # the first build holds the only worker
            raise error("dummy forward broke")
    builder = current_builder()
    assert [builder.state(("op", n)) for n in range(1, 6)] == [BuildState.BUILDING] + [None] * 4
    gate.set()
    assert buildops.join(timeout=WAIT)
    time.sleep(0.1)  # a worker that wrongly went on would have started the next build by now
    assert runs.calls == [("op", 1)] and builder.busy == 0
    stats = report().ops[0]
    assert (stats.built, stats.cancelled, stats.pending) == (1, 4, 0)


def test_inner_pass_raising_cancels_only_its_own_builds(runs):
    gate = threading.Event()
    outer_op = op_listing(runs, name="outer", gate=gate)
    inner_op = op_listing(runs, name="inner")
    with settings.scope(threads=1), rehearsal("outer"):
        outer_op(torch.empty(4, 1))
        assert runs.started.wait(WAIT)
        outer_op(torch.empty(4, 2))
        with pytest.raises(ValueError), build_pass("inner"):
            inner_op(torch.empty(4, 1))
            raise ValueError
    gate.set()
    assert buildops.join(timeout=WAIT)
    assert runs.calls == [("outer", 1), ("outer", 2)]


def test_a_cancelled_key_can_be_queued_again(runs):
    gate = threading.Event()
    blocker = op_listing(runs, name="blocker", gate=gate)
    op = op_listing(runs)
    with settings.scope(threads=1):
        with rehearsal("first"):
            blocker(torch.empty(4, 1))
        assert runs.started.wait(WAIT)
        with pytest.raises(RuntimeError), build_pass("broken"):
            op(torch.empty(4, 3))
            raise RuntimeError
        with rehearsal("again"):
            op(torch.empty(4, 3))
    gate.set()
    assert buildops.join(timeout=WAIT)
    assert runs.count(("op", 3)) == 1


def test_a_pass_entered_again_after_its_body_raised_lists_again(runs):
    gate = threading.Event()
    blocker = op_listing(runs, name="blocker", gate=gate)
    op = op_listing(runs)
    warmup = build_pass("warmup")
    with settings.scope(threads=1):
        with rehearsal("first"):
            blocker(torch.empty(4, 1))
        assert runs.started.wait(WAIT)  # the only worker is busy: op's build stays queued, then is cancelled
        with pytest.raises(RuntimeError), warmup:
            op(torch.empty(4, 3))
            raise RuntimeError("out of memory in the dummy forward")
        assert current_builder().state(("op", 3)) is None
        gate.set()
        with warmup:  # the retry, with the same pass object
            op(torch.empty(4, 3))
    assert current_builder().state(("op", 3)) is BuildState.BUILT and runs.count(("op", 3)) == 1


def test_join_shows_a_bar_on_a_terminal_when_it_waits_long(runs, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    op = op_listing(runs, seconds=0.5)
    with settings.scope(progress_after=0.1), build_pass("warmup"):
        op(torch.empty(4, 3))
    assert "buildops: waiting for builds of pass 'warmup'" in capsys.readouterr().err


def test_join_logs_progress_elsewhere(runs, caplog, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setattr("buildops._core.waiting._LoggedProgress.__init__.__defaults__", (0.1,))
    op = op_listing(runs, seconds=0.6)
    with caplog.at_level(logging.INFO, logger="buildops"), settings.scope(progress_after=0.1), build_pass("warmup"):
        op(torch.empty(4, 3))
    assert "buildops: waiting for builds of pass 'warmup': 0 of 1 done" in caplog.text


def test_a_pass_needs_a_name():
    with pytest.raises(TypeError, match="a build pass needs a non-empty name"):
        build_pass("")


def test_a_task_made_inside_a_pass_is_outside_it_once_the_pass_ends(runs):
    """asyncio copies the context into a task: the ended pass stays in the copy, and must not count there."""
    import asyncio

    op = op_listing(runs)
    inner = {}

    async def later():
        await asyncio.sleep(0.05)  # runs after the rehearsal below has ended
        served = op(torch.ones(2, 5))
        with build_pass("in the task") as nested:  # the outermost pass here: it joins its builds at its end
            op(torch.empty(2, 7))
        inner.update(parent=nested.parent, state=current_builder().state(("op", 7)))
        return served

    async def main():
        with rehearsal("startup"):
            task = asyncio.get_running_loop().create_task(later())
        return await task

    served = asyncio.run(main())
    assert torch.equal(served, torch.ones(2, 5))  # the op ran: no placeholder
    assert inner == {"parent": None, "state": BuildState.BUILT}
    assert buildops.join(timeout=WAIT)


def test_a_pass_goes_on_with_the_new_builder_after_a_shutdown(runs):
    op = op_listing(runs)
    with rehearsal("startup"):
        op(torch.empty(2, 3))
        buildops.shutdown()  # from another thread, a signal handler, a test's reset
        op(torch.empty(2, 5))  # a new signature: queued on the builder that takes builds now
    assert buildops.join(timeout=WAIT) and current_builder().state(("op", 5)) is BuildState.BUILT


def test_a_call_whose_nested_pass_raised_is_listed_again_in_the_enclosing_pass(runs):
    gate = threading.Event()
    blocker = op_listing(runs, name="blocker", gate=gate)
    op = op_listing(runs)
    try:
        with settings.scope(threads=1), rehearsal("outer"):
            blocker(torch.empty(4, 1))
            assert runs.started.wait(WAIT)  # the only worker is busy: op's build stays queued
            with pytest.raises(MemoryError):
                with build_pass("inner"):
                    op(torch.empty(4, 3))
                    raise MemoryError("the dummy forward ran out of memory at this batch")
            assert current_builder().state(("op", 3)) is None  # cancelled
            op(torch.empty(4, 3))  # the retry, in the enclosing pass
            assert current_builder().state(("op", 3)) is BuildState.QUEUED
    finally:
        gate.set()
    assert buildops.join(timeout=WAIT) and runs.calls.count(("op", 3)) == 1


def test_a_rehearsal_says_at_its_end_how_many_builds_still_build_and_none_when_none_do(runs, caplog):
    from buildops.testing import record_listings

    gate = threading.Event()
    held = op_listing(runs, name="held", gate=gate)
    try:
        with caplog.at_level(logging.INFO, logger="buildops"), rehearsal("startup"):
            held(torch.empty(4, 3))
        assert "pass 'startup' done in" in caplog.text and "(1 build(s) queued, 1 still building)" in caplog.text
    finally:
        gate.set()
    assert buildops.join(timeout=WAIT)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="buildops"), record_listings():
        held(torch.empty(4, 5))
    assert "(0 build(s) queued)" in caplog.text and "still building" not in caplog.text


def test_a_pass_says_at_its_end_how_many_of_its_builds_failed(runs, caplog):
    ok, broken = op_listing(runs, name="ok"), op_listing(runs, name="broken", fail=True)
    with caplog.at_level(logging.INFO, logger="buildops"), build_pass("warmup"):
        ok(torch.empty(4, 3)), broken(torch.empty(4, 3))
    assert "pass 'warmup' done in" in caplog.text
    assert "(2 build(s) queued, 1 failed or given up: their ops compile on first use)" in caplog.text
