"""Coverage, visible: ops that list nothing in a pass, and builds that compiled against builds that found their
artifact cached (real Triton compiles, for sm_90 on a machine without a GPU)."""

import logging
import threading

import pytest
import torch

import buildops
from buildops import Build, BuildConfig, BuildState, DynamicSpec, Outcome, build_pass, lists_kernels, report, settings
from buildops._core.passes import listed_nothing
from buildops.reporting import Coverage, ListedNothing
from buildops.testing import record_listings, reset

from conftest import WAIT

bt = pytest.importorskip("buildops.backends.triton")
from triton import knobs  # noqa: E402

from buildops.backends.triton import worker  # noqa: E402
from buildops.backends.triton.worker import workers as triton_workers  # noqa: E402

import triton_kernels as K  # noqa: E402


def listing(name, lists_at=lambda n: True):
    """An op over dim 0 of x swept [1, 4, 16], whose lister lists one no-op build where ``lists_at(rows)``."""
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1, 4, 16])), output="x", name=name)
    def op(x):
        return x

    op.lister(lambda x: [Build(name, (name, x.shape[0], x.dtype), lambda: None)] if lists_at(x.shape[0]) else [])
    return op


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "listed nothing" in r.getMessage()]


# -- ops that list nothing ------------------------------------------------------------------------------------

def test_an_op_that_lists_nothing_is_named_in_one_warning_at_the_end_of_the_outermost_pass(caplog):
    silent, busy = listing("silent", lambda n: False), listing("busy")
    with build_pass("warmup"):
        with build_pass("inner"):
            silent(torch.empty(8, 2))
            busy(torch.empty(8, 2))
        assert warnings_of(caplog) == []  # an inner pass does not warn: the outermost may still list more
        silent(torch.empty(8, 2, dtype=torch.float16))  # a second call signature
        silent(torch.empty(3, 2))  # the first one again: not a first call
    [warning] = warnings_of(caplog)
    assert warning.startswith("buildops: op silent listed nothing in pass 'warmup' for 2 call signature(s); ")
    assert "@silent.lister" in warning and "custom op implemented in C++" in warning
    rep = report()
    assert rep.listed_nothing == (ListedNothing("silent", "warmup", 2),)
    assert "op silent listed nothing in pass 'warmup' for 2 call signature(s)" in rep.format()


def test_an_op_that_lists_at_some_swept_shapes_is_not_named(caplog):
    some = listing("some", lambda n: n >= 16)
    with build_pass("warmup"):
        some(torch.empty(32, 2))
    assert warnings_of(caplog) == [] and report().listed_nothing == ()
    assert report().total("built") == 1


def test_several_ops_that_list_nothing_share_one_warning(caplog):
    one, two = listing("one", lambda n: False), listing("two", lambda n: False)
    with build_pass("warmup"):
        one(torch.empty(8, 2))
        two(torch.empty(8, 2))
        two(torch.empty(8, 3))
    [warning] = warnings_of(caplog)
    assert "2 ops listed nothing in pass 'warmup' (call signatures): one (1), two (2)" in warning
    assert [(e.op, e.signatures) for e in report().listed_nothing] == [("one", 1), ("two", 2)]


def test_an_op_whose_host_code_launches_nothing_is_named(caplog):
    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")
    def eager_only(x):  # no lister: listed by replay, which records no launch
        return x * 2

    with build_pass("warmup"):
        eager_only(torch.ones(4, 2))
    assert [e.op for e in report().listed_nothing] == ["eager_only"]
    assert "@eager_only.lister" in warnings_of(caplog)[0]


def test_a_pass_that_raises_names_nothing_and_reset_forgets(caplog):
    silent = listing("silent", lambda n: False)
    with pytest.raises(RuntimeError), build_pass("warmup"):
        silent(torch.empty(8, 2))
        raise RuntimeError("the body failed")
    assert warnings_of(caplog) == [] and report().listed_nothing == ()
    with build_pass("again"):
        silent(torch.empty(8, 2))
    assert len(report().listed_nothing) == 1
    reset()
    assert report().listed_nothing == () and listed_nothing() == []


def test_a_recorder_names_nothing(caplog):
    silent = listing("silent", lambda n: False)
    with record_listings() as rec:
        silent(torch.empty(8, 2))
    assert len(rec.of("silent")) == 3 and rec.keys("silent") == []  # the recorder shows it listed nothing itself
    assert warnings_of(caplog) == [] and report().listed_nothing == ()


# -- compiled, found cached, skipped, unknown -----------------------------------------------------------------

class Says:
    """A run that says what the Build contract lets it say."""

    def __init__(self, cached=None, skipped=None):
        self.cached, self.skipped = cached, skipped

    def __call__(self):
        return Outcome(cached=self.cached, skipped=self.skipped)


def test_the_report_splits_prebuilt_builds_by_what_their_runs_said():
    builder = buildops._core.default.default_builder()
    runs = [Says(cached=False), Says(cached=False), Says(cached=True), Says(), Says(skipped="interpreter mode"),
            Says(skipped="interpreter mode")]
    futures = [builder.submit(Build("op", ("k", i), run, library="lib")) for i, run in enumerate(runs)]
    futures.append(builder.submit(Build("op", "other", Says(cached=True), library="other")))
    for future in futures:
        future.result(WAIT)
    rep = report()
    assert [(r.cached, r.skipped) for r in rep.builds] == [
        (False, None), (False, None), (True, None), (None, None), (None, "interpreter mode"),
        (None, "interpreter mode"), (True, None)]
    coverage = rep.coverage()
    assert coverage == {"lib": (4, 0), "other": (1, 0)}  # skipped builds are not prebuilt
    lib = coverage["lib"]
    assert (lib.prebuilt, lib.compiled, lib.cached, lib.unknown, dict(lib.skipped)) == (4, 2, 1, 1,
                                                                                        {"interpreter mode": 2})
    prebuilt, late = lib
    assert (prebuilt, late) == (4, 0) and isinstance(lib, Coverage)
    text = rep.format()
    assert "lib: 4 kernel(s) prebuilt (2 compiled, 1 found cached, 1 not known), 0 compiled late" in text
    assert "lib: 2 build(s) skipped: interpreter mode" in text
    assert "other: 1 kernel(s) prebuilt (0 compiled, 1 found cached), 0 compiled late" in text


def test_a_failed_build_says_nothing_of_its_cache():
    run = Says(cached=True)

    def fail():  # a run that raises returns no outcome: the report says nothing of its cache
        raise RuntimeError("compiler crashed")
    builder = buildops._core.default.default_builder()
    builder.submit(Build("op", "fails", fail, library="lib")).exception(WAIT)
    builder.submit(Build("op", "built", run, library="lib")).result(WAIT)
    [failed, built] = report().builds
    assert (failed.state, failed.cached, built.state, built.cached) == (BuildState.FAILED, None, BuildState.BUILT,
                                                                        True)


@pytest.fixture
def fresh_triton(tmp_path, monkeypatch):
    """An empty Triton cache dir and no rows_kernel in memory; the compilation listener as it was after."""
    bt.target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    K.rows_kernel.device_caches.clear()
    previous = knobs.compilation.listener
    yield
    assert knobs.compilation.listener is previous  # buildops' listener is there only while builds compile
    knobs.compilation.listener = previous


def triton_split():
    coverage = report().coverage()["triton"]
    return coverage.prebuilt, coverage.compiled, coverage.cached


def test_a_build_that_compiled_and_the_same_build_found_cached_later(fresh_triton):
    with settings.scope(executor="threads"):
        with build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_split() == (3, 3, 0)
        assert "triton: 3 kernel(s) prebuilt (3 compiled, 0 found cached), 0 compiled late" in report().format()

        reset()  # a fresh builder: the same builds run again, and find their kernels in the JITFunction's memory
        with build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_split() == (3, 0, 3)

        reset()
        K.rows_kernel.device_caches.clear()  # ... or, a new process as it were, in Triton's disk cache
        with build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_split() == (3, 0, 3)
        assert "triton: 3 kernel(s) prebuilt (0 compiled, 3 found cached), 0 compiled late" in report().format()


def test_worker_processes_say_whether_they_compiled(fresh_triton):
    with settings.scope(executor="processes", threads=1):
        with build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_workers.started
        assert triton_split() == (3, 3, 0)  # the workers compiled; this process only loaded from disk
        reset()  # stops the workers too: new ones find the kernels in the disk cache
        K.rows_kernel.device_caches.clear()
        with build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_split() == (3, 0, 3)
        assert report().total("failed") == 0


def test_a_listener_set_by_the_user_still_hears_every_compile(fresh_triton):
    heard = []
    knobs.compilation.listener = lambda *, cache_hit, **_: heard.append(cache_hit)
    try:
        with settings.scope(executor="threads"), build_pass("warmup"):
            K.double_rows(torch.zeros(40, 100))
        assert heard == [False] * 3 and triton_split() == (3, 3, 0)
        assert knobs.compilation.listener is not None and not isinstance(knobs.compilation.listener,
                                                                         worker._CompileListener)
    finally:
        knobs.compilation.listener = None


def test_each_thread_hears_only_its_own_compiles(fresh_triton):
    x = torch.zeros(16, 100)
    K.rows_kernel.warmup(x, x, 16, 100, grid=(1,), BLOCK_M=16, BLOCK_N=128)  # in memory from now on
    both = threading.Barrier(3)
    seen = {}

    def build(name, block_m, watched=True):
        both.wait(WAIT)
        if not watched:  # a thread that builds nothing, compiling meanwhile: heard by nobody
            K.rows_kernel.warmup(x, x, 16, 100, grid=(1,), BLOCK_M=block_m, BLOCK_N=128)
            return
        with worker.watching_compiles() as compiles:
            K.rows_kernel.warmup(x, x, 16, 100, grid=(1,), BLOCK_M=block_m, BLOCK_N=128)
        seen[name] = (list(compiles), worker.found_cached(compiles))

    threads = [threading.Thread(target=build, args=args) for args in
               (("new", 32), ("in memory", 16), ("unwatched", 64, False))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 6)
    assert seen == {"new": ([False], False), "in memory": ([], True)}
    assert knobs.compilation.listener is None or not isinstance(knobs.compilation.listener, worker._CompileListener)


def test_a_triton_build_run_by_hand_says_what_it_did(fresh_triton):
    x = torch.zeros(64)
    [build] = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128)
    K.add_kernel.device_caches.clear()
    with settings.scope(executor="threads"):
        outcome = build.run()
        assert (outcome.cached, outcome.skipped) == (False, None)
        assert build.run().cached is True  # in memory now
