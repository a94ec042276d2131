"""A bad ``BUILDOPS_*`` value fails a pass's start (or ``start_build_workers()``) before anything is listed; one
first seen while serving is logged once and its default used, never raised into the call."""

import logging

import pytest
import torch

import buildops
from buildops import BuildConfig, BuildState, ConfigError, DynamicSpec, build_pass, lists_kernels, rehearsal
from buildops._core import late
from buildops._core.default import current_builder
from buildops.startup import start_build_workers

from conftest import WAIT

# One bad value of each setting a pass's builds, its end or the serving after it read only later
LATE_READ = [
    ("BUILDOPS_LATE_COMPILE", "explode"),
    ("BUILDOPS_PROGRESS_AFTER", "soon"),
    ("BUILDOPS_BUILD_TIMEOUT", "15min"),
    ("BUILDOPS_GPU_RESERVE_MB", "1G"),
    ("BUILDOPS_SWITCH_INTERVAL_US", "fast"),
    ("BUILDOPS_WORKER_NICE", "20"),
    ("BUILDOPS_THREADS", "0"),
    ("BUILDOPS_EXECUTOR", "gpu"),
    ("BUILDOPS_DEEP_GEMM_M", "all"),
    ("BUILDOPS_AUTOTUNE", "maybe"),
    ("BUILDOPS_TRITON_TARGET", "sm90"),
    ("BUILDOPS_NODE_LOCKS", "locks"),
    ("BUILDOPS_STORE", "http://cache:6379"),
    ("BUILDOPS_STORE", "redis://cache:notaport/0"),  # parsed whole: the port, and the database below
    ("BUILDOPS_STORE", "redis://cache:6379/first"),
    ("BUILDOPS_STORE_TIMEOUT", "0"),
    ("BUILDOPS_STORE_LEASE", "inf"),
]


def op_listing(runs, name="op", **build_kwargs):
    """An op with one build per call signature, key (name, x.shape[1]), whose lister counts its calls."""
    listed = []

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name=name)
    def op(x):
        return x

    def lister(x):
        listed.append(x.shape)
        return [runs.build(name, (name, x.shape[1]), **build_kwargs)]

    op.lister(lister)
    return op, listed


@pytest.mark.parametrize("variable, value", LATE_READ)
def test_a_pass_start_names_a_bad_setting_before_anything_is_listed(runs, monkeypatch, variable, value):
    op, listed = op_listing(runs)
    with monkeypatch.context() as patch:
        patch.setenv(variable, value)
        with pytest.raises(ConfigError, match=f"{variable}='{value}'"), build_pass("warmup"):
            op(torch.empty(4, 3))
    assert listed == [] and current_builder() is None  # nothing listed, nothing queued
    with build_pass("warmup"):  # the pass is usable once the value is fixed
        op(torch.empty(4, 3))
    assert current_builder().state(("op", 3)) is BuildState.BUILT


def test_start_build_workers_names_a_bad_setting_even_where_no_worker_starts(monkeypatch):
    monkeypatch.setenv("BUILDOPS_EXECUTOR", "threads")  # no worker process to start
    monkeypatch.setenv("BUILDOPS_LATE_COMPILE", "explode")
    with pytest.raises(ConfigError, match="BUILDOPS_LATE_COMPILE='explode': expected one of warn, error, ignore"):
        start_build_workers()


def test_a_bad_late_compile_mode_in_serving_warns_once_and_uses_warn(runs, monkeypatch, caplog):
    """The late-compile hook runs inside a serving call: a bad mode set after the pass checked it must not raise
    there."""
    op, _ = op_listing(runs)
    with build_pass("warmup"):  # its end arms late-compile detection
        op(torch.empty(4, 3))
    monkeypatch.setenv("BUILDOPS_LATE_COMPILE", "explode")

    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), name="serve")
    def serve(x):  # compiles a kernel on first use, as a backend's compile hook reports it
        late.record(late.LateCompile("triton", "kernels.add", f"x: {x.shape[1]}", (), "here"), ("add", x.shape[1]))
        return x

    with caplog.at_level(logging.WARNING, logger="buildops"):
        for n in (1, 2, 2):
            serve(torch.ones(4, n))
    bad = [r for r in caplog.records if "BUILDOPS_LATE_COMPILE='explode'" in r.getMessage()]
    assert [r.getMessage() for r in bad] == ["buildops: BUILDOPS_LATE_COMPILE='explode': expected one of warn, "
                                             "error, ignore; using the default, warn"]
    assert len(buildops.late_compiles()) == 3
    assert caplog.text.count("late compile of triton kernel kernels.add") == 2  # warn: each variant once


def test_a_bad_wait_setting_in_serving_waits_with_the_default(runs, monkeypatch, caplog):
    """A setting the wait reads (set bad after the pass checked it): the call still waits for its build."""
    op, _ = op_listing(runs, seconds=0.5)
    with rehearsal("startup"):
        op(torch.empty(4, 3))
    monkeypatch.setenv("BUILDOPS_PROGRESS_AFTER", "1s")
    with caplog.at_level(logging.WARNING, logger="buildops"):
        assert torch.equal(op(torch.ones(4, 3)), torch.ones(4, 3))
        assert current_builder().state(("op", 3)) is BuildState.BUILT  # it waited for its build
        assert buildops.join(timeout=WAIT)  # and a join waits too, without raising
    assert caplog.text.count("BUILDOPS_PROGRESS_AFTER='1s'") == 1
    assert "BUILDOPS_PROGRESS_AFTER='1s': expected a number of seconds >= 0; using the default, 1.0" in caplog.text
    assert "waiting for its builds failed" not in caplog.text


def test_a_bad_store_read_where_it_cannot_raise_names_what_it_uses_instead(monkeypatch, caplog):
    from buildops._config import read_or_default, settings

    monkeypatch.setenv("BUILDOPS_STORE", "redis://cache:6379/first")
    with caplog.at_level(logging.WARNING, logger="buildops"):
        assert read_or_default(type(settings).store) == ""
    [warning] = [r.getMessage() for r in caplog.records if "BUILDOPS_STORE" in r.getMessage()]
    assert warning.endswith("; using the default, unset"), warning
