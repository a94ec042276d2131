import concurrent.futures
import os
import sys
import threading
import time
from dataclasses import replace

import pytest

import buildops
from buildops import Build, BuildState, ConfigError, Outcome, settings
from buildops._core.builder import Builder
from buildops._core.default import current_builder, default_builder
from buildops._runtime.state import runtime

from conftest import WAIT, waiting_on


def test_submit_dedups_by_key_in_every_state(runs):
    builder = Builder(threads=2)
    try:
        gate = threading.Event()
        first = builder.submit(runs.build("a", "k", gate=gate))
        assert builder.submit(runs.build("b", "k")) is first  # queued or building
        gate.set()
        assert first.result(WAIT) == "k"
        assert builder.submit(runs.build("c", "k")) is first  # built
        assert runs.calls == ["k"]
        stats = builder.stats()
        assert (stats["a"].built, stats["b"].shared, stats["c"].shared) == (1, 1, 1)
    finally:
        builder.shutdown()


def test_serial_builds_run_one_at_a_time_in_order_beside_the_others(runs):
    builder = Builder(threads=1)
    try:
        gate = threading.Event()
        first = builder.submit(replace(runs.build("op", "tune-1", gate=gate), serial=True))
        second = builder.submit(replace(runs.build("op", "tune-2"), serial=True))
        assert runs.started.wait(WAIT)
        assert builder.submit(runs.build("op", "compile")).result(WAIT) == "compile"  # not held behind tune-1
        assert not second.done()
        gate.set()
        assert (first.result(WAIT), second.result(WAIT)) == ("tune-1", "tune-2")
        assert runs.calls == ["tune-1", "compile", "tune-2"]
    finally:
        builder.shutdown()
    assert builder._threads.serial_locked is not None and not builder._threads.serial_locked.is_alive()


def test_the_serial_worker_runs_first_the_serial_builds_whose_after_builds_are_done(runs):
    builder = Builder(threads=2)
    gate = threading.Event()
    try:
        builder.submit(runs.build("op", "slow compile", gate=gate))
        builder.submit(runs.build("op", "fast compile"))
        tunes = [builder.submit(replace(runs.build("op", f"tune after {after}"), serial=True, after=(after,)))
                 for after in ("slow compile", "fast compile", "a key never submitted")]
        assert tunes[1].result(WAIT) and tunes[2].result(WAIT)  # the worker did not idle behind the first
        assert not tunes[0].done()
        gate.set()
        assert tunes[0].result(WAIT) == "tune after slow compile"
        tuned = [key for key in runs.calls if key.startswith("tune")]
        assert tuned[-1] == "tune after slow compile" and len(tuned) == 3  # the others ran while it waited
    finally:
        gate.set()
        builder.shutdown()


def test_a_serial_build_runs_anyway_once_it_waited_too_long(runs, monkeypatch):
    monkeypatch.setattr(buildops._core.lanes, "AFTER_WAIT_SECONDS", 0.3)
    builder = Builder(threads=1)
    gate = threading.Event()
    try:
        builder.submit(runs.build("op", "stuck compile", gate=gate))
        tune = builder.submit(replace(runs.build("op", "tune"), serial=True, after=("stuck compile",)))
        assert tune.result(WAIT) == "tune"  # its run copes with the missing compile (a tune's tuner compiles it)
    finally:
        gate.set()
        builder.shutdown()
    assert not builder._threads.serial_locked.is_alive()


def test_shutdown_stops_a_serial_worker_that_waits_for_compiles(runs):
    builder = Builder(threads=1)
    gate = threading.Event()
    builder.submit(runs.build("op", "compile", gate=gate))
    tune = builder.submit(replace(runs.build("op", "tune"), serial=True, after=("compile",)))
    assert runs.started.wait(WAIT)
    threading.Timer(0.2, gate.set).start()
    builder.shutdown(wait=True, timeout=WAIT)
    assert tune.cancelled() and not builder._threads.serial_locked.is_alive()


def test_only_serial_builds_may_wait_for_others():
    with pytest.raises(ValueError, match="build 'k' of op op: only serial builds may name builds to run after"):
        Build("op", "k", lambda: None, after=("compile",))


def test_worker_count_follows_the_setting(runs):
    gate = threading.Event()
    with settings.scope(threads=3):
        builder = default_builder()
        for n in range(10):
            builder.submit(runs.build("op", n, gate=gate))
        assert builder.workers == 3
    gate.set()
    assert buildops.join(timeout=WAIT)


def test_default_threads_leave_cores_to_the_engine_and_stop_at_32():
    from buildops._config import cpu_share, default_workers
    assert settings.threads == default_workers(cpu_share()) >= 1
    # none kept below 4 CPUs, a quarter up to 16, then 4; never more than 32
    assert [default_workers(n) for n in (1, 2, 3, 4, 8, 12, 16, 20, 36, 128)] == [1, 2, 3, 3, 6, 9, 12, 16, 32, 32]


def test_a_process_that_only_builds_has_a_build_per_cpu_up_to_32():
    from buildops._config import builder_only_workers
    assert [builder_only_workers(n) for n in (1, 2, 16, 32, 33, 128)] == [1, 2, 16, 32, 32, 32]


def test_shutdown_stops_the_workers(runs):
    before = threading.active_count()
    builder = default_builder()
    for n in range(4):
        builder.submit(runs.build("op", n))
    assert buildops.join(timeout=WAIT)
    assert threading.active_count() > before
    buildops.shutdown()
    assert threading.active_count() == before and current_builder() is None


def test_shutdown_with_a_timeout_waits_that_long_in_all_for_stuck_builds(runs):
    gate = threading.Event()
    builder = Builder(threads=4)
    for n in range(4):
        builder.submit(runs.build("op", n, gate=gate))  # four workers, each stuck in a build
    ends = []  # when each join may last until
    for worker in builder._threads.normal_locked:
        join = worker.join
        worker.join = lambda timeout=None, join=join: (ends.append(time.monotonic() + timeout), join(timeout))
    deadline = time.monotonic() + 0.3
    builder.shutdown(wait=True, timeout=0.3)
    assert ends and max(ends) <= deadline + 0.05  # one deadline for all, not 0.3 s per worker
    gate.set()


def test_shutdown_cancels_queued_builds(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    running = builder.submit(runs.build("op", 1, gate=gate))
    queued = builder.submit(runs.build("op", 2))
    assert runs.started.wait(WAIT)
    threading.Timer(0.2, gate.set).start()
    builder.shutdown(wait=True)
    assert running.result(0) == 1 and queued.cancelled() and builder.busy == 0
    assert builder.stats()["op"].cancelled == 1
    with pytest.raises(RuntimeError, match="shut down"):
        builder.submit(runs.build("op", 3))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_fresh_builder(runs):
    gate = threading.Event()
    parent = default_builder()
    parent.submit(runs.build("op", "held", gate=gate))
    assert runs.started.wait(WAIT)  # a worker is busy, holding whatever it holds
    pid = os.fork()
    if pid == 0:  # the child: must not inherit the parent's builder, threads or pending builds
        code = 1
        try:
            fresh = default_builder()
            ok = fresh is not parent and fresh.workers == 0
            future = fresh.submit(Build("op", "child", lambda: "built in child"))
            ok = ok and future.result(WAIT) == "built in child" and buildops.join(timeout=WAIT)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    gate.set()
    assert os.waitstatus_to_exitcode(status) == 0
    assert buildops.join(timeout=WAIT) and parent.state("held") is BuildState.BUILT


def test_the_report_keeps_every_build_with_when_it_ran_and_how_long_it_waited():
    class WaitsForOthers:
        def __call__(self):
            time.sleep(0.02)
            return Outcome(waited=0.01)

    before = time.perf_counter()
    default_builder().submit(Build("op", "key", WaitsForOthers()))
    assert buildops.join(timeout=WAIT)
    (record,) = buildops.report().builds
    assert record.state is BuildState.BUILT and record.build.key == "key"
    assert record.started >= before and record.seconds >= 0.02 and record.waited == 0.01


def wait_for_no_holders():
    """Other tests' background preparation (``start_build_workers``) may still hold the short interval."""
    deadline = time.monotonic() + WAIT
    while runtime.gil_holders and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_gil_switch_interval_is_short_while_builds_are_in_flight(runs):
    wait_for_no_holders()
    previous = sys.getswitchinterval()
    assert previous > 200e-6  # Python's default, 5 ms
    gate = threading.Event()
    builder = Builder(threads=1)
    try:
        builder.submit(runs.build("op", 1, gate=gate))
        queued = builder.submit(runs.build("op", 2))
        assert runs.started.wait(WAIT)
        assert sys.getswitchinterval() == pytest.approx(200e-6)  # threads that hand the GIL back get it soon
        assert queued.cancel()  # its owner cancels it: it no longer counts as in flight once a worker skips it
        gate.set()
        assert builder.join(timeout=WAIT)
        deadline = time.monotonic() + WAIT
        while sys.getswitchinterval() != previous and time.monotonic() < deadline:  # the skip follows the join
            time.sleep(0.01)
        assert sys.getswitchinterval() == previous  # the last build out restores it
        with settings.scope(switch_interval_us=0):  # 0: leave it alone
            builder.submit(Build("op", 3, lambda: sys.getswitchinterval()))
            assert builder.join(timeout=WAIT) and builder.future(3).result(0) == previous
        gate.clear()
        builder.submit(runs.build("op", 4, gate=gate))
        sys.setswitchinterval(0.001)  # someone else's choice, made while builds run, is kept
        gate.set()
        assert builder.join(timeout=WAIT) and sys.getswitchinterval() == pytest.approx(0.001)
    finally:
        gate.set()
        builder.shutdown()
        sys.setswitchinterval(previous)


def test_shutdown_with_queued_builds_restores_the_switch_interval(runs):
    wait_for_no_holders()
    previous = sys.getswitchinterval()
    gate = threading.Event()
    builder = Builder(threads=1)
    builder.submit(runs.build("op", 1, gate=gate))
    builder.submit(runs.build("op", 2))
    assert runs.started.wait(WAIT)
    threading.Timer(0.2, gate.set).start()
    builder.shutdown(wait=True)
    assert sys.getswitchinterval() == previous


def test_a_bad_switch_interval_setting_fails_the_submit_and_queues_nothing(monkeypatch, runs):
    monkeypatch.setenv("BUILDOPS_SWITCH_INTERVAL_US", "fast")
    builder = Builder(threads=1)
    with pytest.raises(ConfigError, match="BUILDOPS_SWITCH_INTERVAL_US='fast'"):
        builder.submit(runs.build("op", 1))
    assert builder.state(1) is None and runs.count() == 0
    monkeypatch.setenv("BUILDOPS_SWITCH_INTERVAL_US", "200")
    assert builder.submit(runs.build("op", 1)).result(WAIT) == 1
    builder.shutdown()


def test_a_build_its_owner_cancels_is_forgotten_once_skipped(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    try:
        builder.submit(runs.build("op", "running", gate=gate))
        cancelled = builder.submit(runs.build("op", "cancelled"))
        assert runs.started.wait(WAIT) and cancelled.cancel()  # through the future, not Builder.cancel
        gate.set()
        assert builder.join(timeout=WAIT)
        deadline = time.monotonic() + WAIT
        while builder.state("cancelled") is not None and time.monotonic() < deadline:  # the worker skips it
            time.sleep(0.01)
        assert builder.state("cancelled") is None and not builder.gpu_pending()
        assert builder.stats()["op"].cancelled == 1
        assert builder.submit(runs.build("op", "cancelled")).result(WAIT) == "cancelled"  # queued again, and built
    finally:
        gate.set()
        builder.shutdown()


def test_a_report_is_one_instant_of_the_builder():
    """Builds finish while reports are taken: each op's listed builds are always in exactly one of its counts."""
    builder = default_builder()
    submitter = threading.Thread(target=lambda: [builder.submit(Build("op", i, lambda: None)) for i in range(2000)])
    submitter.start()
    reports = 0
    while submitter.is_alive() or not buildops.join(timeout=0):
        for op in buildops.report().ops:
            reports += 1
            assert op.listed - op.shared == op.built + op.failed + op.cancelled + op.pending, op
    submitter.join()
    assert reports > 0



def test_join_for_an_op_waits_for_the_builds_it_shares(runs):
    gate = threading.Event()
    builder = default_builder()
    builder.submit(runs.build("decode", "shared-kernel", gate=gate))
    shared = builder.submit(runs.build("prefill", "shared-kernel"))  # listed second: counted as shared
    assert buildops.join(op="prefill", timeout=0.2) is False and not shared.done()
    gate.set()
    assert buildops.join(op="prefill", timeout=WAIT) and shared.done()


def test_a_key_whose_future_its_owner_cancelled_is_queued_again_at_once(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    try:
        builder.submit(runs.build("op", "long", gate=gate))
        cancelled = builder.submit(runs.build("op", "key"))
        assert runs.started.wait(WAIT) and cancelled.cancel()
        again = builder.submit(runs.build("other", "key"))  # before any worker skipped the cancelled one
        assert again is not cancelled and not again.cancelled()
        gate.set()
        assert again.result(WAIT) == "key" and builder.state("key") is BuildState.BUILT
    finally:
        gate.set()
        builder.shutdown()


def test_a_claim_that_raises_builds_the_key_unshared(caplog):
    class Unprintable:  # its repr names the node-wide lock, and raises
        def __repr__(self):
            raise ValueError("no repr")

    builder = Builder(threads=1)
    try:
        future = builder.submit(Build("op", Unprintable(), lambda: "built", label="unprintable"))
        assert future.result(WAIT) == "built" and builder.join(timeout=WAIT)
        assert "claiming build" in caplog.text
    finally:
        builder.shutdown()


def test_a_build_past_the_timeout_is_given_up_and_another_worker_takes_its_place(runs, caplog):
    gate = threading.Event()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0.2):
        stuck = builder.submit(runs.build("op", "stuck", gate=gate))
        assert runs.started.wait(WAIT)
        [old] = builder._threads.normal_locked
        with pytest.raises(buildops.BuildTimeoutError,
                           match=r"build 'stuck' of op op ran 0\.\d s, past BUILDOPS_BUILD_TIMEOUT=0\.2; given up"):
            stuck.result(WAIT)
        assert builder.join(timeout=WAIT) and builder.state("stuck") is BuildState.FAILED
        assert "will compile it on first use" in caplog.text
        after = builder.submit(runs.build("op", "after"))
        assert after.result(WAIT) == "after"  # a new worker, though the only one is still inside "stuck"
    assert old not in builder._threads.normal_locked and builder.busy == 1  # the stuck run still counts as running
    gate.set()
    old.join(WAIT)
    assert not old.is_alive() and len(builder._threads.normal_locked) == 1  # it ended once its run returned
    assert builder.state("stuck") is BuildState.FAILED  # its late outcome is dropped
    assert builder.stats()["op"].failed == 1 and builder.stats()["op"].built == 1
    builder.shutdown()


def test_a_serial_build_past_the_timeout_lets_the_next_serial_build_run(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0.2):
        stuck = builder.submit(replace(runs.build("op", "tune-1", gate=gate), serial=True))
        nxt = builder.submit(replace(runs.build("op", "tune-2"), serial=True))
        with pytest.raises(buildops.BuildTimeoutError):
            stuck.result(WAIT)
        assert nxt.result(WAIT) == "tune-2"
    gate.set()
    builder.shutdown()


def test_no_build_timeout_with_zero(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0):
        future = builder.submit(runs.build("op", "slow", gate=gate))
        assert not builder.join(timeout=0.3) and not builder._watchdog.started
    gate.set()
    assert future.result(WAIT) == "slow"
    builder.shutdown()


def test_a_given_up_build_is_abandoned_so_a_worker_process_stuck_in_it_stops(caplog):
    import logging

    from buildops._runtime.pools import WorkerPool

    import pool_tasks

    pool = WorkerPool("test", lambda: 1)

    class StuckInAWorker:
        def __init__(self):
            self.given_up = threading.Event()
            self.thread = None  # the builder's thread that runs it

        def abandon(self):
            self.given_up.set()
            pool.stop_workers()

        def __call__(self):
            self.thread = threading.current_thread()
            return pool.run("stuck", pool_tasks.slow, 600, given_up=self.given_up)

    caplog.set_level(logging.INFO, logger="buildops")
    builder = Builder(threads=1)
    try:
        # The worker started first: the timeout below then runs out while the task is in the worker, however long a
        # loaded machine takes to start one (it once ran out while the pool still started)
        assert pool.run("warm", pool_tasks.slow, 0) == 0
        with settings.scope(build_timeout=1.0):
            run = StuckInAWorker()
            future = builder.submit(Build("op", "stuck", run, abandon=run.abandon))
            with pytest.raises(buildops.BuildTimeoutError):
                future.result(WAIT * 6)
        # This run's own thread: another test's builder may have a worker of the same name still ending
        assert run.thread is not None and run.thread not in builder._threads.normal_locked
        run.thread.join(WAIT * 3)
        assert not run.thread.is_alive()  # its run raised once its worker was stopped
        assert "ended after" in caplog.text  # ... and that outcome was dropped
    finally:
        builder.shutdown()
        pool.stop_workers()  # whatever happened: a worker left in the 600 s task would hold up the shutdown
        pool.shutdown()


def test_a_bad_build_timeout_fails_the_submit_and_queues_nothing(monkeypatch, runs):
    builder = Builder(threads=1)
    monkeypatch.setenv("BUILDOPS_BUILD_TIMEOUT", "15min")
    with pytest.raises(ConfigError, match="BUILDOPS_BUILD_TIMEOUT='15min'"):
        builder.submit(runs.build("op", "k"))
    assert builder.state("k") is None and builder.join(timeout=0)
    builder.shutdown()


def test_an_endless_timeout_beside_a_short_one_leaves_the_watchdog_working(runs):
    gate = threading.Event()
    builder = Builder(threads=2)
    with settings.scope(build_timeout=float("inf")):
        endless = builder.submit(runs.build("op", "endless", gate=gate))
    with settings.scope(build_timeout=0.2):
        short = builder.submit(runs.build("op", "short", gate=gate))
    with pytest.raises(buildops.BuildTimeoutError):
        short.result(WAIT)
    assert not endless.done()
    gate.set()
    assert endless.result(WAIT) == "endless"
    builder.shutdown()


def test_the_watchdog_still_gives_up_a_build_that_runs_on_after_shutdown(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0.3):
        future = builder.submit(runs.build("op", "stuck", gate=gate))
        assert runs.started.wait(WAIT)
    builder.shutdown(wait=False)
    with pytest.raises(buildops.BuildTimeoutError):
        future.result(WAIT)  # a call waiting on it is let go
    gate.set()


def test_a_gpu_build_given_up_but_still_running_keeps_graph_capture_refused(runs):
    from buildops import GraphCaptureDuringBuild, prepare_graph_capture
    from buildops._core.watchdog import stuck_gpu_builds

    gate = threading.Event()
    with settings.scope(build_timeout=0.2):
        future = default_builder().submit(runs.build("op", "stuck", gate=gate, uses_gpu=True))
        with pytest.raises(buildops.BuildTimeoutError):
            future.result(WAIT)
    assert [b.key for b in default_builder().gpu_pending()] == ["stuck"]  # what the capture guard checks
    with pytest.raises(GraphCaptureDuringBuild, match="given up as timed out still run"):
        prepare_graph_capture(timeout=WAIT)
    buildops.shutdown(wait=False)
    with pytest.raises(GraphCaptureDuringBuild, match="given up as timed out"):
        prepare_graph_capture()  # its builder is gone, its run is not
    gate.set()
    for _ in range(int(WAIT / 0.01)):
        if not stuck_gpu_builds():
            break
        time.sleep(0.01)
    prepare_graph_capture(timeout=WAIT)  # once its run returned


def test_a_given_up_build_lets_the_other_processes_of_the_node_build_its_key(runs):
    gate = threading.Event()
    here, there = Builder(threads=1), Builder(threads=1)  # two claimants of the node's lock files
    with settings.scope(build_timeout=0.3):
        stuck = here.submit(runs.build("op", "shared", gate=gate))
        with pytest.raises(buildops.BuildTimeoutError):
            stuck.result(WAIT)
        assert there.submit(runs.build("op", "shared")).result(WAIT) == "shared"
    gate.set()
    here.shutdown(), there.shutdown()


def test_a_key_whose_repr_raises_is_given_up_all_the_same(runs):
    class Unprintable:
        def __repr__(self):
            raise ValueError("no repr")

    gate = threading.Event()
    key = Unprintable()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0.2):
        future = builder.submit(runs.build("op", key, gate=gate))
        with pytest.raises(buildops.BuildTimeoutError, match="build <Unprintable key> of op op"):
            future.result(WAIT)
        assert builder.submit(replace(runs.build("op", "next", gate=gate), key="next")) is not None
        with pytest.raises(buildops.BuildTimeoutError):  # the watchdog lived on
            builder.future("next").result(WAIT)
    gate.set()
    builder.shutdown()


def test_an_abandon_that_blocks_does_not_hold_up_the_watchdog(runs):
    gate, blocked = threading.Event(), threading.Event()

    class BlocksWhenAbandoned:
        def abandon(self):
            blocked.set()
            gate.wait(WAIT)

        def __call__(self):
            gate.wait(WAIT)

    builder = Builder(threads=2)
    with settings.scope(build_timeout=0.2):
        run = BlocksWhenAbandoned()
        first = builder.submit(Build("op", "first", run, abandon=run.abandon))
    with settings.scope(build_timeout=0.6):
        second = builder.submit(runs.build("op", "second", gate=gate))
    with pytest.raises(buildops.BuildTimeoutError):
        first.result(WAIT)
    assert blocked.wait(WAIT)
    with pytest.raises(buildops.BuildTimeoutError):
        second.result(WAIT / 2)  # given up on time, while the first one's abandon() still blocks
    gate.set()
    builder.shutdown()


def test_shutdown_does_not_wait_for_a_build_given_up_meanwhile(runs):
    gate = threading.Event()
    builder = Builder(threads=1)
    with settings.scope(build_timeout=0.5):
        builder.submit(runs.build("op", "stuck", gate=gate))
        assert runs.started.wait(WAIT)
    stopping = threading.Thread(target=builder.shutdown)  # waits for running builds, with no timeout
    stopping.start()
    stopping.join(WAIT)
    assert not stopping.is_alive()  # it returned once the build was given up, though its thread still runs
    gate.set()


# -- serving first ----------------------------------------------------------------------------------------------


def wait_for_in_thread(builder, futures, op="serving"):
    """``builder.wait_for(futures, op)`` on a thread, as an op's call outside a pass makes it. Returns the thread,
    a list that gets what the wait returned, and an event set once it has expedited and begun waiting."""
    waiting, outcome = waiting_on(builder), []
    thread = threading.Thread(target=lambda: outcome.append(builder.wait_for(futures, op, timeout=WAIT)))
    thread.start()
    return thread, outcome, waiting


def test_a_build_a_serving_call_waits_for_runs_next(runs):
    builder = Builder(threads=1)
    gate = threading.Event()
    try:
        builder.submit(runs.build("op", "first", gate=gate))
        queued = [builder.submit(runs.build("op", f"queued {n}")) for n in range(1, 6)]
        assert runs.started.wait(WAIT)
        thread, outcome, waiting = wait_for_in_thread(builder, [queued[4]])
        assert waiting.wait(WAIT)
        gate.set()
        thread.join(WAIT)
        assert outcome == [True]
        assert builder.join(timeout=WAIT)
        assert runs.calls == ["first", "queued 5", "queued 1", "queued 2", "queued 3", "queued 4"]
        assert builder.stats()["serving"].wait_seconds > 0
    finally:
        gate.set()
        builder.shutdown()


def test_expedited_builds_keep_their_order_ahead_of_the_others(runs):
    builder = Builder(threads=1)
    gate = threading.Event()
    try:
        builder.submit(runs.build("op", "first", gate=gate))
        queued = [builder.submit(runs.build("op", n)) for n in range(6)]
        assert runs.started.wait(WAIT)
        assert builder.expedite([queued[4], queued[2]]) == 2
        assert builder.expedite([queued[5]]) == 1  # behind the two expedited before it
        assert builder.expedite([queued[2], queued[5]]) == 0  # already ahead: nothing moves
        gate.set()
        assert builder.join(timeout=WAIT)
        assert runs.calls == ["first", 2, 4, 5, 0, 1, 3]
    finally:
        gate.set()
        builder.shutdown()


def test_expediting_a_build_running_or_done_changes_nothing(runs):
    builder = Builder(threads=1)
    gate = threading.Event()
    try:
        done = builder.submit(runs.build("op", "done"))
        assert done.result(WAIT) == "done"
        runs.started.clear()
        running = builder.submit(runs.build("op", "running", gate=gate))
        queued = [builder.submit(runs.build("op", n)) for n in range(3)]
        assert runs.started.wait(WAIT)
        assert builder.expedite([done, running]) == 0
        assert builder.expedite([]) == 0
        gate.set()
        assert all(f.result(WAIT) is not None for f in queued)
        assert runs.calls == ["done", "running", 0, 1, 2]
    finally:
        gate.set()
        builder.shutdown()


def test_expediting_skips_cancelled_builds(runs):
    builder = Builder(threads=1)
    gate = threading.Event()
    try:
        builder.submit(runs.build("op", "first", gate=gate))
        by_pass = builder.submit(runs.build("op", "cancelled by its pass"), owner="pass")
        by_owner = builder.submit(runs.build("op", "cancelled through its future"))
        wanted = builder.submit(runs.build("op", "wanted"))
        builder.submit(runs.build("op", "last"))
        assert runs.started.wait(WAIT)
        assert builder.cancel([by_pass], releases=lambda owner: owner == "pass") == 1
        assert by_owner.cancel()
        assert builder.expedite([by_pass, by_owner, wanted]) == 1
        gate.set()
        assert builder.join(timeout=WAIT)
        assert runs.calls == ["first", "wanted", "last"]
        assert by_pass.cancelled() and by_owner.cancelled()
    finally:
        gate.set()
        builder.shutdown()


def test_an_expedited_serial_build_goes_first_with_the_compiles_it_needs(runs):
    builder = Builder(threads=1)
    gate, tuning, tune_started = threading.Event(), threading.Event(), threading.Event()
    try:
        builder.submit(runs.build("op", "first", gate=gate))
        for n in range(1, 5):
            builder.submit(runs.build("op", f"compile {n}"))
        builder.submit(Build("op", "tune in progress", lambda: tune_started.set() or tuning.wait(WAIT), serial=True))
        assert tune_started.wait(WAIT) and runs.started.wait(WAIT)  # both workers busy: the rest wait in queues
        tunes = [builder.submit(replace(runs.build("op", f"tune after {n}"), serial=True, after=(f"compile {n}",)))
                 for n in (1, 4)]
        assert builder.expedite([tunes[1]]) == 2  # the tune, and the one compile it runs after
        tuning.set()
        gate.set()
        assert all(t.result(WAIT) for t in tunes)
        assert builder.join(timeout=WAIT)
        compiles = [c for c in runs.calls if c.startswith(("first", "compile"))]
        assert compiles == ["first", "compile 4", "compile 1", "compile 2", "compile 3"]
        tuned = [c for c in runs.calls if c.startswith("tune")]
        assert tuned == ["tune after 4", "tune after 1"]
    finally:
        gate.set()
        tuning.set()
        builder.shutdown()


def test_while_an_urgent_serial_build_waits_for_its_compiles_no_other_takes_the_worker(monkeypatch):
    from buildops._core.build import Record
    from buildops._core.lanes import SerialQueue

    monkeypatch.setattr(buildops._core.lanes, "AFTER_WAIT_SECONDS", 0.0)  # whoever waits is past its patience
    built: set[str] = set()
    changed = threading.Condition()
    serial = SerialQueue(changed, lambda key: key in built, lambda: False)

    def record(key, after=()):
        return Record(Build("op", key, lambda: None, serial=True, after=after), concurrent.futures.Future())

    ready, waiting = record("ready"), record("needs a compile", after=("compile",))
    with changed:
        serial.put_locked(ready)
        serial.put_locked(waiting)
        assert serial.expedite_locked(waiting) and not serial.expedite_locked(waiting)
        assert serial.pending == [waiting, ready]
    assert serial.take() is waiting  # not the ready one: it runs regardless, as one waiting too long does
    assert serial.take() is ready


def test_a_queued_record_put_back_keeps_its_lane():
    from buildops._core.lanes import Lanes

    class Item:
        def __init__(self, name):
            self.name, self.urgent = name, False

    lanes = Lanes(threading.Condition())
    a, b, c = Item("a"), Item("b"), Item("c")
    for item in (a, b, c):
        lanes.put(item)
    with lanes._changed:
        assert lanes.expedite_locked([c]) == 1
    assert lanes.take() is c
    lanes.put(c)  # put back, as a worker does when another process of the node builds its key
    assert [lanes.take().name for _ in range(3)] == ["c", "a", "b"]
    lanes.put(None)
    lanes.put(c)
    assert lanes.take() is c  # urgent still: ahead of a stop
    assert lanes.take() is None
