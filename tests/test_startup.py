import gc
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest
import torch

import buildops
from buildops import (
    BuildConfig,
    BuildState,
    DynamicSpec,
    GraphCaptureDuringBuild,
    lists_kernels,
    prepare_graph_capture,
    settings,
)
from buildops._core.default import current_builder, default_builder
from buildops.startup import phase, phases, rehearse_then_load, start_build_workers

from conftest import WAIT


def test_a_graph_capture_cannot_begin_while_gpu_builds_run(runs):
    gate = threading.Event()
    default_builder().submit(runs.build("attention", "gpu-build", gate=gate, uses_gpu=True))
    assert runs.started.wait(WAIT)
    with pytest.raises(GraphCaptureDuringBuild, match=r"1 GPU build\(s\) of buildops are queued or running "
                                                      r"\(ops: attention\); call buildops.prepare_graph_capture\(\)"):
        torch.cuda.CUDAGraph.capture_begin(object())
    with pytest.raises(TimeoutError, match="GPU builds still running after 0.1 s"):
        prepare_graph_capture(timeout=0.1)
    gate.set()
    prepare_graph_capture(timeout=WAIT)
    with pytest.raises(Exception) as reached:  # no build pending: the call reaches torch's own capture_begin,
        torch.cuda.CUDAGraph.capture_begin(object())  # which rejects a non-graph in its own way
    assert not isinstance(reached.value, GraphCaptureDuringBuild)


def test_a_gpu_build_its_owner_cancelled_does_not_block_a_capture(runs):
    """Still queued behind a CPU build, but it will never run: prepare_graph_capture() returns, and so the
    capture it prepared for must begin."""
    gate = threading.Event()
    try:
        with buildops.settings.scope(threads=1):
            default_builder().submit(runs.build("norm", "cpu-build", gate=gate))
            assert runs.started.wait(WAIT)
            assert default_builder().submit(runs.build("attention", "gpu-build", uses_gpu=True)).cancel()
            prepare_graph_capture(timeout=WAIT)
            with pytest.raises(Exception) as reached:
                torch.cuda.CUDAGraph.capture_begin(object())
            assert not isinstance(reached.value, GraphCaptureDuringBuild)
    finally:
        gate.set()


def test_cpu_builds_do_not_block_a_capture(runs):
    gate = threading.Event()
    default_builder().submit(runs.build("norm", "cpu-build", gate=gate))
    prepare_graph_capture(timeout=WAIT)  # returns at once: nothing of it uses the GPU
    gate.set()


def test_rehearse_then_load_overlaps_the_load_with_the_builds(runs):
    gate = threading.Event()

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
    def op(x):
        return x

    op.lister(lambda x: [runs.build("op", ("op", x.shape[1]), gate=gate, uses_gpu=True)])

    def load():
        assert runs.started.wait(WAIT)  # the rehearsal's build runs while the checkpoint loads
        assert current_builder().state(("op", 8)) is BuildState.BUILDING
        gate.set()
        return "weights"

    phases(clear=True)
    with phase("create model"):
        pass
    assert rehearse_then_load(lambda: op(torch.zeros(2, 8)), load) == "weights"
    assert current_builder().state(("op", 8)) is BuildState.BUILT  # joined before returning
    assert [name for name, _ in phases()] == ["create model", "startup: rehearsal", "startup: load",
                                              "startup: collect garbage", "startup: wait until ready"]
    assert all(seconds >= 0 for _, seconds in phases())
    assert buildops.join(timeout=WAIT)


def test_ready_waits_for_the_called_shapes_and_gpu_work_not_the_rest_of_the_sweep(runs):
    rest = threading.Event()  # holds the builds of the swept shapes the rehearsal did not call

    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")  # called at 4 rows: swept at 1, 2 and 4
    def op(x):
        return x

    def lister(x):
        rows = x.shape[0]
        builds = [runs.build("op", ("op", rows), gate=None if rows == 4 else rest, uses_gpu=True, loads_only=True)]
        if rows == 1:  # GPU work (an autotuning, say) at a shape nobody called: ready waits for it too
            builds.append(runs.build("op", ("tune", rows), uses_gpu=True, seconds=0.05))
        return builds

    op.lister(lister)
    try:
        with settings.scope(threads=4):
            assert rehearse_then_load(lambda: op(torch.zeros(4, 8)), lambda: "weights") == "weights"
            builder = current_builder()
            assert builder.state(("op", 4)) is BuildState.BUILT and builder.state(("tune", 1)) is BuildState.BUILT
            assert {builder.state(("op", 1)), builder.state(("op", 2))} <= {BuildState.QUEUED, BuildState.BUILDING}
            # Serving: a call waits for its own shape's builds only, and one at a shape nobody swept for nothing.
            assert _returns_soon(lambda: op(torch.zeros(4, 8))) and _returns_soon(lambda: op(torch.zeros(3, 8)))
            waiting = threading.Thread(target=op, args=(torch.zeros(2, 8),))
            waiting.start()
            waiting.join(0.3)
            assert waiting.is_alive()  # its build is held
            rest.set()
            waiting.join(WAIT)
            assert not waiting.is_alive()
    finally:
        rest.set()
    assert buildops.join(timeout=WAIT) and builder.state(("op", 2)) is BuildState.BUILT


def test_ready_and_serving_never_wait_for_the_tunings_of_shapes_not_called(runs):
    held = threading.Event()  # holds the tunings (serial builds) of the swept shapes the rehearsal did not call

    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")  # called at 4 rows: swept at 1, 2 and 4
    def op(x):
        return x

    def lister(x):
        rows = x.shape[0]
        builds = [runs.build("op", ("op", rows), uses_gpu=True, loads_only=True)]
        if rows != 4:
            builds.append(runs.build("op", ("tune", rows), uses_gpu=True, serial=True, gate=held))
        return builds

    op.lister(lister)
    try:
        assert rehearse_then_load(lambda: op(torch.zeros(4, 8)), lambda: "weights") == "weights"
        builder = current_builder()
        assert {builder.state(("tune", 1)), builder.state(("tune", 2))} <= {BuildState.QUEUED, BuildState.BUILDING}
        # a serving call at a shape whose tuning is held waits for its compile only: the tuner runs meanwhile
        # with a config it has (the Triton backend's tunings)
        assert _returns_soon(lambda: op(torch.zeros(2, 8)))
        assert builder.state(("op", 2)) is BuildState.BUILT
    finally:
        held.set()
    assert buildops.join(timeout=WAIT) and builder.state(("tune", 2)) is BuildState.BUILT


def _returns_soon(call) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(WAIT / 2)


def test_ready_gpu_waits_for_every_gpu_build_and_a_bad_value_is_refused_first(runs):
    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")
    def op(x):
        return x

    op.lister(lambda x: [runs.build("op", ("op", x.shape[0]), uses_gpu=True, loads_only=True, seconds=0.01)])
    with pytest.raises(ValueError, match=r"rehearse_then_load\(ready='soon'\): expected 'called'"):
        rehearse_then_load(lambda: op(torch.zeros(4, 8)), lambda: "weights", ready="soon")
    assert runs.count() == 0  # nothing ran
    rehearse_then_load(lambda: op(torch.zeros(4, 8)), lambda: "weights", ready="gpu")
    assert all(current_builder().state(("op", rows)) is BuildState.BUILT for rows in (1, 2, 4))


def test_rehearse_then_load_can_start_the_load_with_the_rehearsal(runs):
    started = threading.Event()

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
    def op(x):
        return x

    op.lister(lambda x: [runs.build("op", ("op", x.shape[1]), uses_gpu=True)])

    def rehearse():
        assert started.wait(WAIT)  # the load is already running while the dummy forwards list
        op(torch.zeros(2, 8))

    def load():
        started.set()
        return "weights"

    assert rehearse_then_load(rehearse, load, overlap=True) == "weights"
    assert current_builder().state(("op", 8)) is BuildState.BUILT


def test_a_failed_rehearsal_beside_a_failed_load_raises_its_error_and_logs_the_loads(caplog):
    load_ended = threading.Event()

    def rehearse():
        raise ValueError("the dummy forward has a bug")

    def load():
        time.sleep(0.2)
        load_ended.set()
        raise OSError("checkpoint shard 3 is missing")

    with caplog.at_level("ERROR", logger="buildops"), pytest.raises(ValueError, match="dummy forward has a bug"):
        rehearse_then_load(rehearse, load, overlap=True)
    assert load_ended.is_set()  # the load had ended: nothing writes into the model once the error is raised
    [record] = [r for r in caplog.records if "the load failed too" in r.getMessage()]
    assert "checkpoint shard 3 is missing" in str(record.exc_info[1])


def test_rehearse_then_load_collects_the_rehearsals_garbage_before_it_returns():
    collected = []

    class Cycle:
        def __init__(self):
            self.me = self  # freed only by the cycle collector

    def rehearse():
        weakref.finalize(Cycle(), collected.append, "the rehearsal's cycle")

    frozen = gc.get_freeze_count()  # not always 0: Python 3.12 on the GPU host starts with some frozen
    gc.disable()  # no automatic collection in between: only rehearse_then_load's own
    try:
        rehearse_then_load(rehearse, lambda: None)
        assert collected == ["the rehearsal's cycle"]
        assert gc.get_freeze_count() <= frozen  # frozen only when asked (a frozen object may be freed meanwhile)
    finally:
        gc.enable()


class _Cycle:
    """Freed only by the cycle collector; says so in ``collected``."""

    def __init__(self, collected: list, name: str):
        self.me = self
        weakref.finalize(self, collected.append, name)


def test_rehearse_then_load_can_freeze_the_heap_and_collect_only_what_the_start_made():
    collected = []
    _Cycle(collected, "garbage left before the start")
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        loaded = rehearse_then_load(lambda: _Cycle(collected, "the rehearsal's garbage"), lambda: ["weights"],
                                    freeze_heap=True)
        assert collected == ["the rehearsal's garbage"]
        assert gc.get_freeze_count() > frozen and not any(o is loaded for o in gc.get_objects())  # frozen too
        gc.collect()
        assert collected == ["the rehearsal's garbage"]  # frozen as the start began: not collected, as documented
        gc.unfreeze()
        gc.collect()
        assert collected == ["the rehearsal's garbage", "garbage left before the start"]
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_heap_to_freeze_is_collected_after_the_wait_so_no_garbage_made_meanwhile_is_frozen(monkeypatch):
    import buildops.startup as startup

    collected = []
    wait = startup._wait_for_ready_builds

    def wait_making_garbage(*args):
        _Cycle(collected, "garbage made while the start waits")
        return wait(*args)

    monkeypatch.setattr(startup, "_wait_for_ready_builds", wait_making_garbage)
    gc.disable()
    try:
        rehearse_then_load(lambda: None, lambda: None, freeze_heap=True)
        assert collected == ["garbage made while the start waits"]  # collected, not frozen
        assert [name for name, _ in phases()][-2:] == ["startup: wait until ready", "startup: collect garbage"]
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_warm_request_runs_once_ready_outside_the_pass_and_its_garbage_is_collected(runs):
    gate = threading.Event()
    steps, collected = [], []

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output=lambda x: torch.full_like(x, -1.0))
    def op(x):
        return x + 1  # runs only outside a pass: inside one, the placeholder (-1) comes back

    op.lister(lambda x: [runs.build("op", ("op", x.shape[0]), gate=gate, uses_gpu=True)])

    def load():
        steps.append("load")
        gate.set()
        return "weights"

    def warm():
        steps.append(("warm", current_builder().state(("op", 4)), op(torch.zeros(4, 8))[0, 0].item()))
        _Cycle(collected, "the warm request's garbage")

    phases(clear=True)
    gc.disable()  # no automatic collection in between: only rehearse_then_load's own
    try:
        assert rehearse_then_load(lambda: op(torch.zeros(4, 8)), load, warm=warm) == "weights"
        assert steps == ["load", ("warm", BuildState.BUILT, 1.0)]  # once ready, and the op itself ran
        assert collected == ["the warm request's garbage"]
    finally:
        gc.enable()
    assert [name for name, _ in phases()] == ["startup: rehearsal", "startup: load", "startup: wait until ready",
                                              "startup: warm", "startup: collect garbage"]


def test_a_warm_request_that_raises_fails_the_start_and_unfreezes_the_heap():
    def warm():
        raise RuntimeError("the sampling kernel failed")

    with pytest.raises(RuntimeError, match="sampling kernel failed"):
        rehearse_then_load(lambda: None, lambda: None, freeze_heap=True, warm=warm)
    assert gc.get_freeze_count() == 0


def test_a_failed_start_unfreezes_the_heap(monkeypatch):
    def load():
        raise OSError("checkpoint shard 3 is missing")

    with pytest.raises(OSError, match="shard 3"):
        rehearse_then_load(lambda: None, load, freeze_heap=True)
    assert gc.get_freeze_count() == 0  # what was frozen before too: a frozen object is only a collection skipped

    def interrupted():
        raise KeyboardInterrupt  # a Ctrl-C during the final collection

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(gc, "collect", interrupted)
        rehearse_then_load(lambda: None, lambda: None, freeze_heap=True)
    assert gc.get_freeze_count() == 0


def test_build_workers_start_early_only_where_builds_use_them():
    triton_builds = pytest.importorskip("buildops.backends.triton.worker")
    with buildops.settings.scope(executor="threads"):
        assert not start_build_workers() and not triton_builds.workers.started
    with buildops.settings.scope(executor="processes", threads=1):
        assert start_build_workers()  # returns at once; the workers start in the background, with no build
        for _ in range(int(WAIT * 6 / 0.1)):  # warm() only looks: it starts nothing
            if triton_builds.workers.warm():
                break
            time.sleep(0.1)
        assert triton_builds.workers.warm()  # started, and every worker warmed up without an error


def test_a_bad_worker_priority_setting_fails_the_call_that_starts_the_workers(monkeypatch):
    triton_builds = pytest.importorskip("buildops.backends.triton.worker")
    monkeypatch.setenv("BUILDOPS_WORKER_NICE", "low")
    with buildops.settings.scope(executor="processes"), \
            pytest.raises(buildops.ConfigError, match="BUILDOPS_WORKER_NICE='low'"):
        start_build_workers()  # here, where the engine sees it, not on the thread that would start them
    assert not triton_builds.workers.started


EARLY_START = r"""
import glob, os, sys, threading, time
import buildops.startup
from buildops.startup import start_build_workers

if __name__ == "__main__":  # workers import the main module as they start (and have torch already)
    assert "torch" not in sys.modules  # so that an engine can start the workers before its own imports
    assert start_build_workers()
    assert start_build_workers()  # a second call prepares nothing more
    assert sum(t.name == "buildops-prepare" for t in threading.enumerate()) == 1  # still waiting for torch
    import torch, triton  # the engine's own imports, while the workers start
    from triton.runtime.cache import triton_key
    from buildops.backends.triton.worker import workers

    def prepared():
        done = not any(t.name.startswith("buildops-prepare") for t in threading.enumerate())
        return done and triton_key.cache_info().currsize == 1

    deadline = time.monotonic() + 60
    while not (workers.warm() and prepared()) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("workers warm" if workers.warm() else "workers not warm")
    print("prepared" if prepared() else "not prepared")  # the first build's hash
    from triton.runtime.driver import driver
    print("no driver here" if driver._active is None else "a driver")  # CUDA untouched: no GPU picked yet
    # Triton's CUDA helper module, built ahead of the driver's first use (where there is CUDA to build it for)
    built = bool(glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "*", "cuda_utils*")))
    print("utils built" if built == torch.cuda.is_available() else f"utils built: {built}")
    buildops.shutdown()  # stops the workers; a later call starts them again
    assert not workers.started and start_build_workers()
    while not workers.warm() and time.monotonic() < deadline + 60:
        time.sleep(0.1)
    print("workers warm again" if workers.warm() else "workers not started again")
"""


def run_script(path, text: str) -> subprocess.CompletedProcess:
    """``text`` run as the main script ``path``, with one Triton build worker process."""
    pytest.importorskip("triton")
    path.write_text(text)
    env = dict(os.environ, BUILDOPS_EXECUTOR="processes", BUILDOPS_THREADS="1",
               TRITON_CACHE_DIR=str(path.parent / "triton-cache"))
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)


def test_build_workers_start_before_torch_is_imported(tmp_path):
    done = run_script(tmp_path / "early_start.py", EARLY_START)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["workers warm", "prepared", "no driver here", "utils built",
                                        "workers warm again"], done.stderr[-3000:]


def test_the_helper_process_gets_this_process_import_path_and_its_answer_is_read(monkeypatch):
    import json

    import buildops.backends.triton.startup as S
    # The helper's own code, but printing its import path where it would print Triton's cache.
    monkeypatch.setattr(S, "_UTILS_SCRIPT", S._UTILS_SCRIPT.split("from buildops")[0] + "print(json.dumps(sys.path))")
    utils = S._start_building_triton_utils()
    assert json.loads(S._helper_cache_dir(utils)) == [p for p in sys.path if isinstance(p, str)]


@pytest.mark.parametrize("helper_built_into, builds_here", [("this cache", False), ("another cache", True),
                                                            (None, True)])
def test_the_preparation_builds_the_helper_module_where_the_helper_did_not(monkeypatch, tmp_path,
                                                                           helper_built_into, builds_here):
    pytest.importorskip("triton")
    from triton import knobs

    import buildops.backends.triton.startup as S
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "this"))
    answers = {"this cache": knobs.cache.dir, "another cache": str(tmp_path / "other"), None: None}
    monkeypatch.setattr(S, "_helper_cache_dir", lambda utils: answers[helper_built_into])  # None: it failed
    built = []
    monkeypatch.setattr(S, "_build_triton_utils", lambda: built.append(knobs.cache.dir) or 0)
    imported = []
    monkeypatch.setattr(S.importlib, "import_module", imported.append)
    S._prepare_builds(utils=object())  # torch and Triton are imported: it goes straight on
    assert built == ([knobs.cache.dir] if builds_here else [])
    assert imported == ["sympy"]  # what a replay's first meta op would import


def test_the_preparation_imports_what_replays_need_before_it_hashes_triton(monkeypatch):
    import buildops.backends.triton.startup as S
    done = []
    monkeypatch.setattr(S.importlib, "import_module", done.append)
    monkeypatch.setattr(S, "_helper_cache_dir", lambda utils: None)
    monkeypatch.setattr(S, "_build_triton_utils", lambda: done.append("utils") or 0)
    import buildops.backends.triton.build as B
    monkeypatch.setattr(B, "hash_triton_install", lambda: done.append("hash"))
    S._prepare_builds(utils=object())
    assert done == ["sympy", "hash", "utils"]  # a rehearsal's first op needs the first soonest


NO_GUARD = r"""
import buildops.startup
assert buildops.startup.start_build_workers()  # at import, with no `if __name__ == "__main__":`
import concurrent.futures
from buildops.backends.triton.worker import workers
workers.get()
concurrent.futures.wait(workers._starting, timeout=100)
print("workers warm" if workers.warm() else "workers not warm")  # a worker running this module would print too
"""


def test_a_main_module_that_starts_workers_at_import_starts_them_once(tmp_path):
    script = tmp_path / "no_guard.py"
    done = run_script(script, NO_GUARD)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["workers warm"], (done.stdout, done.stderr[-3000:])
    assert "as it is imported" not in done.stderr


def test_a_stuck_gpu_build_does_not_fail_the_start(runs, caplog):
    gate = threading.Event()
    with settings.scope(build_timeout=0.2):
        def rehearse():
            buildops._core.default.default_builder().submit(runs.build("attn", "stuck", gate=gate, uses_gpu=True))
        try:
            assert rehearse_then_load(rehearse, lambda: "the loaded model") == "the loaded model"
        finally:
            gate.set()
    assert "given up as timed out still run" in caplog.text


def test_a_start_marks_when_it_was_ready_for_reports_to_split_tunings_by():
    import time

    import buildops.startup as S
    before = time.perf_counter()
    S.rehearse_then_load(lambda: None, lambda: None)
    assert S.ready_time() is not None and before <= S.ready_time() <= time.perf_counter()


DEEP_GEMM_EARLY = r"""
import os, sys
from multiprocessing import forkserver
from buildops.backends.deep_gemm.startup import FORKSERVER_PRELOAD, start_workers

if __name__ == "__main__":
    assert start_workers()  # returns at once, before the engine's own imports
    assert "torch" not in sys.modules
    server = forkserver._forkserver._forkserver_pid
    modules = forkserver._forkserver._preload_modules
    print("server started" if server else "no server")
    print("it preloads the workers' code" if set(FORKSERVER_PRELOAD) <= set(modules) else f"it preloads {modules}")
    import torch  # the engine's own, while the forkserver imports
    import buildops
    from buildops.backends.deep_gemm.workers import pool
    parent = pool.run("its parent", os.getppid, build=False)  # DeepGEMM's first worker
    print("the worker is its child" if parent == server else f"the worker's parent: {parent}, not {server}")
    with open(f"/proc/{server}/maps") as maps:  # the forkserver imported torch before it forked the worker
        print("torch in the forkserver" if "libtorch" in maps.read() else "no torch in the forkserver")
    buildops.shutdown()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the forkserver's mappings in /proc")
def test_deep_gemm_workers_fork_from_a_forkserver_started_before_torch_is_imported(tmp_path):
    script = tmp_path / "deep_gemm_early.py"
    script.write_text(DEEP_GEMM_EARLY)
    done = subprocess.run([sys.executable, str(script)], env=dict(os.environ, BUILDOPS_EXECUTOR="processes"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["server started", "it preloads the workers' code", "the worker is its child",
                                        "torch in the forkserver"], done.stderr[-3000:]


BOTH_BACKENDS = r"""
import sys
from multiprocessing import forkserver
from buildops.backends.deep_gemm.startup import FORKSERVER_PRELOAD
from buildops.backends.triton.worker import FORKSERVER_PRELOAD as TRITONS, FORKSERVER_PRELOAD_FIRST
from buildops.startup import start_build_workers

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])  # a deep_gemm package: DeepGEMM counts as installed
    assert start_build_workers()  # Triton's pool starts on a thread, which may start the forkserver first
    from buildops.backends.triton.worker import workers
    workers.get()  # once it has
    with open(f"/proc/{forkserver._forkserver._forkserver_pid}/cmdline") as cmdline:  # what it was started with
        started_with = cmdline.read()
    print(repr([*FORKSERVER_PRELOAD_FIRST, *FORKSERVER_PRELOAD, *TRITONS]) in started_with or started_with)
    import buildops
    buildops.shutdown()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="reads the forkserver's command line in /proc")
def test_the_forkserver_imports_what_every_installed_backends_workers_need(tmp_path):
    pytest.importorskip("triton")
    (tmp_path / "deep_gemm").mkdir()
    (tmp_path / "deep_gemm" / "__init__.py").write_text("")
    script = tmp_path / "both_backends.py"
    script.write_text(BOTH_BACKENDS)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, BUILDOPS_EXECUTOR="processes", BUILDOPS_THREADS="1",
                                   TRITON_CACHE_DIR=str(tmp_path / "triton-cache")))
    assert done.returncode == 0 and done.stdout.strip() == "True", (done.stdout, done.stderr[-3000:])


FORKED_AFTER_START = r"""
import os
from buildops.backends.deep_gemm.startup import start_workers

if __name__ == "__main__":
    assert start_workers()
    child = os.fork()
    if child == 0:  # a forked child (a data loader's worker, an engine's rank) builds with workers of its own
        code = 1
        try:
            from buildops.backends.deep_gemm.workers import pool
            code = 0 if pool.run("its parent", os.getppid, build=False) != os.getppid() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    print("the child built" if os.waitstatus_to_exitcode(status) == 0 else f"the child failed: {status}")
"""


def test_a_child_forked_after_the_early_start_gets_a_forkserver_of_its_own(tmp_path):
    script = tmp_path / "forked_after_start.py"
    script.write_text(FORKED_AFTER_START)
    done = subprocess.run([sys.executable, str(script)], env=dict(os.environ, BUILDOPS_EXECUTOR="processes"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "the child built", (done.stdout, done.stderr[-3000:])


def test_deep_gemm_starts_no_forkserver_where_its_builds_run_on_threads(monkeypatch):
    from buildops.backends.deep_gemm import startup

    started = []
    monkeypatch.setattr(startup, "start_forkserver", started.append)
    with settings.scope(executor="threads"):
        assert not startup.start_workers() and not started
    with settings.scope(executor="auto"):  # DeepGEMM builds in processes whatever the CPUs (Triton may not)
        startup.start_workers()
    assert started == [startup.FORKSERVER_PRELOAD]
