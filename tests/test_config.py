import pydoc
import re
import threading

import pytest
import torch

from buildops import BuildConfig, ConfigError, DynamicSpec, build_pass, lists_kernels, settings
from buildops._config import Setting, markdown_table

from conftest import WAIT


@pytest.mark.parametrize("variable, value, attribute, message", [
    ("BUILDOPS_THREADS", "abc", "threads", "BUILDOPS_THREADS='abc': expected a whole number >= 1"),
    ("BUILDOPS_THREADS", "0", "threads", "BUILDOPS_THREADS='0': expected a whole number >= 1"),
    ("BUILDOPS", "maybe", "enabled", "BUILDOPS='maybe': expected 1 or 0"),
    ("BUILDOPS_PROGRESS_AFTER", "-1", "progress_after", "BUILDOPS_PROGRESS_AFTER='-1': expected a number of seconds"),
    ("BUILDOPS_EXECUTOR", "gpu", "executor", "BUILDOPS_EXECUTOR='gpu': expected one of auto, threads, processes"),
    ("BUILDOPS_LATE_COMPILE", "raise", "late_compile", "BUILDOPS_LATE_COMPILE='raise': expected one of warn, error"),
    ("BUILDOPS_TRITON_TARGET", "sm90", "triton_target", "BUILDOPS_TRITON_TARGET='sm90': expected BACKEND:ARCH"),
    ("BUILDOPS_GPU_RESERVE_MB", "1G", "gpu_reserve_mb", "BUILDOPS_GPU_RESERVE_MB='1G': expected a whole number of MiB"),
    ("BUILDOPS_TUNE_GAP_MS", "0.5", "tune_gap_ms",
     "BUILDOPS_TUNE_GAP_MS='0.5': expected a whole number of milliseconds"),
    ("BUILDOPS_SWITCH_INTERVAL_US", "0.2ms", "switch_interval_us",
     "BUILDOPS_SWITCH_INTERVAL_US='0.2ms': expected a whole number of microseconds"),
    ("BUILDOPS_DEEP_GEMM_M", "all", "deep_gemm_m", "BUILDOPS_DEEP_GEMM_M='all': expected one of relaxed, full, off"),
    ("BUILDOPS_GPU_RESERVE_MB", "\u00b2", "gpu_reserve_mb", "BUILDOPS_GPU_RESERVE_MB='\u00b2': expected a whole"),
    ("BUILDOPS_TRITON_TARGET", "cuda:\u00b2", "triton_target", "BUILDOPS_TRITON_TARGET='cuda:\u00b2': expected"),
    ("BUILDOPS_NODE_LOCKS", "locks", "node_locks", "BUILDOPS_NODE_LOCKS='locks': expected an absolute directory"),
    ("BUILDOPS_BUILD_TIMEOUT", "10m", "build_timeout", "BUILDOPS_BUILD_TIMEOUT='10m': expected a number of seconds"),
    ("BUILDOPS_WORKER_NICE", "20", "worker_nice", "BUILDOPS_WORKER_NICE='20': expected a whole number from 0"),
    ("BUILDOPS_WORKER_NICE", "-5", "worker_nice", "BUILDOPS_WORKER_NICE='-5': expected a whole number from 0"),
])
def test_bad_settings_name_the_variable(monkeypatch, variable, value, attribute, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=message):
        getattr(settings, attribute)


def test_bad_setting_fails_where_it_is_first_needed(monkeypatch):
    monkeypatch.setenv("BUILDOPS", "2")
    with pytest.raises(ConfigError, match="BUILDOPS='2'"):
        lists_kernels(BuildConfig(DynamicSpec("x", 0)))(lambda x: x)
    with pytest.raises(ConfigError, match="BUILDOPS='2'"):
        with build_pass("warmup"):
            pass


def test_settings_read_the_environment_when_asked(monkeypatch):
    monkeypatch.setenv("BUILDOPS_THREADS", "5")
    assert settings.threads == 5
    monkeypatch.setenv("BUILDOPS", "off")
    assert settings.enabled is False
    monkeypatch.delenv("BUILDOPS")
    assert settings.enabled is True


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "No"])
def test_node_locks_go_off_as_every_switch_does(monkeypatch, value):
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", value)
    assert settings.node_locks == "off"  # not a directory of that name in the working directory


def test_scope_values_read_as_the_environment_would(monkeypatch):
    with settings.scope(enabled="0", late_compile="ERROR", triton_target=("cuda", 80), node_locks="Off"):
        assert settings.enabled is False and settings.late_compile == "error"
        assert settings.triton_target == ("cuda", 80) and settings.node_locks == "off"


def test_scope_overrides_and_restores(monkeypatch):
    monkeypatch.setenv("BUILDOPS_THREADS", "5")
    with settings.scope(threads=2):
        assert settings.threads == 2
        with settings.scope(enabled=False):
            assert (settings.threads, settings.enabled) == (2, False)
        assert settings.enabled is True
    assert settings.threads == 5
    with pytest.raises(ConfigError, match="BUILDOPS_THREADS='0'"):
        with settings.scope(threads=0):
            pass
    known = ("autotune, build_timeout, deep_gemm_m, enabled, executor, gpu_reserve_mb, late_compile, node_locks, "
             "progress_after, serving_tune, store, store_lease, store_max_mb, store_timeout, switch_interval_us, "
             "threads, triton_target")
    with pytest.raises(ConfigError, match=f"unknown setting; known: {known}"):
        with settings.scope(thread=2):
            pass
    with pytest.raises(AttributeError, match="buildops has no setting 'thread'"):
        settings.thread  # noqa: B018 - the read is the test


def test_scopes_that_overlap_in_two_threads_restore_only_their_own_settings(monkeypatch):
    monkeypatch.delenv("BUILDOPS_GPU_RESERVE_MB", raising=False)
    monkeypatch.delenv("BUILDOPS_THREADS", raising=False)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with settings.scope(threads=5):
            first_in.set()
            assert second_in.wait(WAIT)
            seen["threads"] = settings.threads
        first_out.set()

    def second():  # enters after the first and leaves after it
        assert first_in.wait(WAIT)
        with settings.scope(gpu_reserve_mb=512):
            second_in.set()
            assert first_out.wait(WAIT)
            seen["threads after the first left"] = settings.threads

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert seen == {"threads": 5, "threads after the first left": settings.threads}  # the first's override gone
    assert settings.threads != 5 and settings.gpu_reserve_mb == 1024 and settings._overrides == {}


def test_bad_setting_leaves_ops_untouched(monkeypatch):
    op = lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")(lambda x: x + 1)
    monkeypatch.setenv("BUILDOPS_THREADS", "many")
    assert torch.equal(op(torch.zeros(2)), torch.ones(2))  # outside a pass, settings are never read

VARIABLES = ["BUILDOPS", "BUILDOPS_THREADS", "BUILDOPS_EXECUTOR", "BUILDOPS_GPU_RESERVE_MB", "BUILDOPS_DEEP_GEMM_M",
             "BUILDOPS_NODE_LOCKS", "BUILDOPS_LATE_COMPILE", "BUILDOPS_AUTOTUNE", "BUILDOPS_SERVING_TUNE",
             "BUILDOPS_TRITON_TARGET",
             "BUILDOPS_SWITCH_INTERVAL_US", "BUILDOPS_WORKER_NICE", "BUILDOPS_BUILD_TIMEOUT", "BUILDOPS_STORE",
             "BUILDOPS_STORE_TIMEOUT", "BUILDOPS_STORE_LEASE", "BUILDOPS_STORE_MAX_MB", "BUILDOPS_TUNE_GAP_MS",
             "BUILDOPS_PROGRESS_AFTER"]


def test_each_setting_is_a_descriptor_declared_on_the_class(monkeypatch):
    declared = type(settings).threads
    assert isinstance(declared, Setting) and (declared.name, declared.env) == ("threads", "BUILDOPS_THREADS")
    assert declared.__doc__.startswith("BUILDOPS_THREADS: Builds at once") and "a whole number >= 1" in declared.__doc__
    assert declared.parse(" 3 ") == 3 and declared.doc == settings.describe()["BUILDOPS_THREADS"]
    assert list(settings.describe()) == VARIABLES
    monkeypatch.setenv("BUILDOPS_THREADS", "7")
    assert settings.threads == 7 and type(settings).threads is declared  # the class gives the declaration
    with pytest.raises(AttributeError, match=r"override it with settings.scope\(threads=...\)"):
        settings.threads = 2
    assert settings.threads == 7


def test_help_shows_every_variable_with_its_doc():
    text = pydoc.render_doc(type(settings), renderer=pydoc.plaintext)
    for variable, doc in settings.describe().items():
        assert f"{variable}: {doc}" in text


def test_validate_reads_every_setting_or_the_named_ones(monkeypatch):
    settings.validate()
    monkeypatch.setenv("BUILDOPS_WORKER_NICE", "20")
    settings.validate("threads", "enabled")  # the bad one is not among them
    with pytest.raises(ConfigError, match="BUILDOPS_WORKER_NICE='20': expected a whole number from 0"):
        settings.validate("worker_nice")
    monkeypatch.setenv("BUILDOPS_THREADS", "0")
    with pytest.raises(ConfigError) as raised:
        settings.validate()
    assert str(raised.value) == ("BUILDOPS_THREADS='0': expected a whole number >= 1; BUILDOPS_WORKER_NICE='20': "
                                 "expected a whole number from 0 (the engine's priority) to 19 (the lowest)")
    with settings.scope(worker_nice=3, threads=2):
        settings.validate()  # overrides win over the environment, here too
    with pytest.raises(ConfigError, match=r"settings.validate\('thread'\): unknown setting; known: autotune, "):
        settings.validate("thread")


def test_markdown_table_has_a_row_per_setting_from_its_declaration(monkeypatch):
    monkeypatch.setenv("BUILDOPS_THREADS", "many")  # the table reads no variable
    lines = markdown_table().splitlines()
    assert lines[:2] == ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    rows = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)]
        assert cells[0] == cells[-1] == "" and len(cells) == 6, line
        rows[cells[1].strip("`")] = cells[2:5]
    assert list(rows) == VARIABLES
    assert rows["BUILDOPS_THREADS"][:2] == ["a whole number >= 1",
                                            "CPU share less a quarter (at most 4 kept), at most 32"]
    assert rows["BUILDOPS_NODE_LOCKS"][1] == "`<tmp>/buildops-node-locks-<uid>`"
    assert rows["BUILDOPS_EXECUTOR"][:2] == ["one of auto, threads, processes", "`auto`"]
    assert rows["BUILDOPS"][1] == "`1`" and rows["BUILDOPS_TRITON_TARGET"][1] == "`cuda:90`"
    for variable, doc in settings.describe().items():
        assert rows[variable][2] == doc
