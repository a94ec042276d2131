"""Autotuning outside the builds (buildops/backends/triton/tunings.py): after a pass no launch tunes on a serving
thread, and choices are kept beside Triton's cache. Compiled for real (sm_90 through the compile-only driver
where there is no GPU); what needs timing runs on a GPU only."""

import pytest
import torch
import triton

pytest.importorskip("triton")

from triton.compiler.compiler import CompiledKernel

import buildops
from buildops import LateCompileError, build_pass, late_compiles, settings
from buildops._core.late import armed
from buildops.backends.triton import serving, target, tunings
from buildops.backends.triton.autotune import config_for_replay

import dispatch_library as L

TUNER = L._softmax_kernel
CONFIGS = TUNER.configs
ROWS = (TUNER.fn.arg_names.index("ROWS"),)


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    L.forget()
    TUNER.fn.device_caches.clear()
    TUNER.cache.clear()
    yield
    TUNER.cache.clear()


def key(rows, cols=256):
    return (rows, cols, "torch.float32", "torch.float32")


def after_a_pass():
    """Serving as it is once a pass has ended: any pass arms the late-compile watchers."""
    with build_pass("warmup"):
        pass
    assert armed()


def tuned_late():
    """The late tunings (these tests' launches also compile late: nothing was built for them)."""
    return [late for late in late_compiles() if late.kind == "tuning"]


def launch(rows, cols=256):
    """The library's softmax launch at ``rows``, compiled but not run (no GPU here to run it)."""
    x = torch.zeros(rows, cols)
    return TUNER.run(x, torch.empty_like(x), rows, cols, grid=(1,), warmup=True, BLOCK=cols)


def test_after_a_pass_a_launch_at_an_untuned_key_runs_the_nearest_tuned_config_and_tunes_nothing(monkeypatch):
    after_a_pass()
    TUNER.cache[key(48)] = CONFIGS[2]
    TUNER.cache[key(4096)] = CONFIGS[1]
    monkeypatch.setattr(type(TUNER), "_bench", lambda *a, **k: pytest.fail("a serving launch timed configs"))
    kernel = launch(40)
    assert isinstance(kernel, CompiledKernel) and kernel.src.constants[ROWS] == CONFIGS[2].kwargs["ROWS"]
    assert TUNER.best_config == CONFIGS[2] and key(40) not in TUNER.cache
    [late] = tuned_late()
    assert late.kind == "tuning" and late.kernel.endswith("_softmax_kernel") and "(40, 256" in late.variant
    assert late.describe().startswith("late tuning of triton kernel")
    launch(40)  # again at the same key: still untuned here (no GPU to tune on), recorded once
    assert len(tuned_late()) == 1
    with settings.scope(late_compile="error"), pytest.raises(LateCompileError, match="late tuning of triton"):
        launch(5)
    assert tuned_late()[-1].variant.startswith("autotuning key (5, 256")
    text = buildops.report().format()  # apart from the compiles, and each described
    assert "triton: 2 tuning(s) late" in text
    assert "late tuning of triton kernel dispatch_library._softmax_kernel" in text
    assert buildops.report().coverage()["triton"].late == len(late_compiles()) - 2


def test_with_no_tuned_key_the_first_config_runs(monkeypatch):
    after_a_pass()
    monkeypatch.setattr(type(TUNER), "_bench", lambda *a, **k: pytest.fail("a serving launch timed configs"))
    assert launch(40).src.constants[ROWS] == CONFIGS[0].kwargs["ROWS"]


def test_a_tuned_key_runs_as_triton_runs_it_and_inline_or_no_autotuning_keeps_triton_s_own_tuning():
    after_a_pass()
    calls = []

    def triton_s_run(tuner, *args, **kwargs):
        calls.append(args[2])
        return "Triton's own"

    x = torch.zeros(8, 256)
    args, kwargs = (x, x, 8, 256), {"grid": (1,), "warmup": True, "BLOCK": 256}
    TUNER.cache[key(8)] = CONFIGS[1]
    assert serving.serve(TUNER, triton_s_run, args, kwargs) == "Triton's own"  # tuned: nothing to decide
    del TUNER.cache[key(8)]
    with settings.scope(serving_tune="inline"):
        assert serving.serve(TUNER, triton_s_run, args, kwargs) == "Triton's own"
    with settings.scope(autotune=False):  # no tuning is built: it tunes at first use, as the setting says
        assert serving.serve(TUNER, triton_s_run, args, kwargs) == "Triton's own"
    assert calls == [8, 8, 8] and late_compiles() == []


def test_before_any_pass_a_launch_is_triton_s_own():
    calls = []
    x = torch.zeros(8, 256)
    serving.serve(TUNER, lambda tuner, *a, **k: calls.append(a[2]), (x, x, 8, 256), {"grid": (1,)})
    assert calls == [8]


def test_a_kept_choice_is_taken_without_timing_by_a_replay_and_by_serving(monkeypatch):
    tunings.keep(TUNER, key(64), CONFIGS[1])
    assert tunings.kept(TUNER, key(64)) == CONFIGS[1] and tunings.kept(TUNER, key(32)) is None
    x = torch.zeros(64, 256, device="meta")
    assert config_for_replay(TUNER, (x, x, 64, 256), {"BLOCK": 256}, list(CONFIGS)) == 1
    assert TUNER.cache[key(64)] == CONFIGS[1]  # taken into the tuner's memory, as Triton's own disk cache does
    TUNER.cache.clear()
    after_a_pass()
    monkeypatch.setattr(type(TUNER), "_bench", lambda *a, **k: pytest.fail("a kept choice was timed again"))
    assert launch(64).src.constants[ROWS] == CONFIGS[1].kwargs["ROWS"]
    assert tuned_late() == []  # compiled late (no build here), but not tuned


def test_a_kept_choice_that_cannot_be_read_or_names_another_config_is_a_miss(tmp_path):
    tunings.keep(TUNER, key(64), CONFIGS[1])
    [path] = (tmp_path / "triton-cache" / "buildops-tunings").iterdir()
    path.write_text("{not json")
    assert tunings.kept(TUNER, key(64)) is None
    path.write_text('{"config": {"kwargs": {"ROWS": 3}, "num_warps": 4, "num_stages": 3, "num_ctas": 1, '
                    '"maxnreg": null}}')
    assert tunings.kept(TUNER, key(64)) is None


def test_nearest_takes_the_least_distance_among_keys_of_the_same_kind():
    choices = {(48, 256, "f32"): "a", (64, 256, "f32"): "b", (40, 256, "f16"): "c", (40, "x", "f32"): "d"}
    assert tunings.nearest(choices, (40, 256, "f32")) == "a"
    assert tunings.nearest(choices, (56, 256, "f32")) == "a"  # a tie: the smaller key
    assert tunings.nearest(choices, (40, 128, "bf16")) is None


def softmax_plain(x):
    """The library's kernel launched plainly (no launch cache of its own): the tuner decides at every launch."""
    out = torch.empty_like(x)
    rows, cols = x.shape
    TUNER[lambda meta: (triton.cdiv(rows, meta["ROWS"]),)](x, out, rows, cols, BLOCK=triton.next_power_of_2(cols))
    return out


@pytest.mark.gpu
def test_on_a_gpu_a_serving_launch_at_an_untuned_key_queues_its_tuning_and_uses_it_once_done():
    with build_pass("warmup"):
        L.softmax(torch.zeros(64, 256, device="cuda"))  # tuned in the pass's builds, at 64 rows
    assert key(64) in TUNER.cache
    x = torch.randn(37, 256, device="cuda")
    torch.testing.assert_close(softmax_plain(x), torch.softmax(x, -1))  # at once, with 64 rows' config
    assert [late.kind for late in late_compiles() if late.kind == "tuning"] == ["tuning"]
    assert buildops.join(timeout=120) and key(37) in TUNER.cache  # the queued tuning ran on the serial worker
    torch.testing.assert_close(softmax_plain(x), torch.softmax(x, -1))
    assert TUNER.best_config == TUNER.cache[key(37)]
    assert len([late for late in late_compiles() if late.kind == "tuning"]) == 1


def test_a_kept_choice_travels_as_a_build_store_artifact_to_another_node(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    tunings.keep(TUNER, key(64), CONFIGS[2])  # tuned on node A
    on_a = tunings.KeptChoice(TUNER, key(64), torch.device("cuda", 0))
    files = on_a.collect()
    assert on_a.known_locally() and list(files) == [on_a.path.name]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "node-b"))  # node B: its own cache, nothing kept
    on_b = tunings.KeptChoice(TUNER, key(64), torch.device("cuda", 1))
    assert on_b.identity() == on_a.identity() and not on_b.known_locally() and on_b.collect() is None
    assert tunings.kept(TUNER, key(64)) is None
    on_b.install(files)
    assert on_b.known_locally() and tunings.kept(TUNER, key(64)) == CONFIGS[2]
    on_b.install({on_b.path.name: b"{}"})  # an entry already there is never replaced
    assert tunings.kept(TUNER, key(64)) == CONFIGS[2]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    other_model = tunings.KeptChoice(TUNER, key(64), torch.device("cuda", 0))
    assert other_model.identity() != on_a.identity()  # timings of another model are not this one's


def test_a_tune_build_is_claimed_across_the_node_and_carries_its_kept_choice(monkeypatch):
    from buildops.backends.triton import autotune

    monkeypatch.setattr(autotune, "compile_only", lambda: False)  # as on a GPU, where tunings are built
    x = torch.zeros(40, 256)
    build = autotune.tune_build("softmax", TUNER, (x, x, 40, 256), {"BLOCK": 256}, [], lambda *a, **k: None)
    assert build.serial and build.shared and isinstance(build.artifact, tunings.KeptChoice)
    tunings.keep(TUNER, key(40), CONFIGS[1])
    TUNER.cache.clear()
    assert autotune.tune_build("softmax", TUNER, (x, x, 40, 256), {"BLOCK": 256}, [], lambda *a, **k: None) is None
