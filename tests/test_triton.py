"""Compile-only Triton builds, compiled for real (for sm_90 on a machine without a GPU)."""

import os
import signal
import sys
import threading
import time

import pytest
import torch
from triton import knobs

import buildops
from buildops import LateCompileError, build_pass, late_compiles, report, settings
from buildops.testing import record_listings

import triton_kernels as K
from conftest import WAIT, holding, in_a_child_forked_while_held

bt = pytest.importorskip("buildops.backends.triton")
from triton.runtime.jit import JITFunction  # noqa: E402

from buildops.backends.triton import autotune, driver, patches, record, versions  # noqa: E402
from buildops.backends.triton import build as triton_build  # noqa: E402
from buildops.backends.triton.stand_ins import stand_in  # noqa: E402
from buildops.backends.triton.state import triton_state  # noqa: E402
from buildops.backends.triton.worker import workers as triton_workers  # noqa: E402

ORIGINAL_JIT_RUN = JITFunction.run


@pytest.fixture(autouse=True)
def fresh_triton(tmp_path, monkeypatch):
    """An empty Triton cache dir, and no kernel already in memory, for each test; counts compiles."""
    bt.target()  # without a GPU: the compile-only driver, so that plain warmups work here too
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    for kernel in (K.add_kernel, K.rows_kernel, driver.inner_jit(K.scale_kernel)):
        kernel.device_caches.clear()
    compiles = []
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiles.append(
        (kw["fn"].name, kw["compile"]["signature"], kw["compile"]["constants"], kw["is_manual_warmup"]))
    yield compiles
    knobs.runtime.jit_post_compile_hook = previous


def build_all(builds):
    for build in builds:
        build.run()


def cached(kernel, *args, **kwargs):
    jit = driver.inner_jit(kernel)
    stand_ins = tuple(stand_in(a) for a in args)
    return record._launch_key(jit, stand_ins, kwargs) in jit.device_caches[0][0]


LAUNCHES = [  # (description, args, options): each a distinct specialization of add_kernel
    ("n == 1 is a constexpr", lambda x: (x, x, x, 1), {"BLOCK": 128}),
    ("n divisible by 16", lambda x: (x, x, x, 32), {"BLOCK": 128}),
    ("n not divisible by 16", lambda x: (x, x, x, 17), {"BLOCK": 128}),
    ("misaligned pointer", lambda x: (x[1:], x, x, 32), {"BLOCK": 128}),
    ("other constexpr and warps", lambda x: (x, x, x, 32), {"BLOCK": 256, "num_warps": 8}),
    ("fp16", lambda x: (x.half(), x.half(), x.half(), 32), {"BLOCK": 128}),
]


def test_a_build_compiles_exactly_the_variant_the_launch_looks_up(fresh_triton):
    x = torch.zeros(64)
    builds = [b for _, args, options in LAUNCHES for b in bt.triton_builds("add", K.add_kernel, *args(x), **options)]
    assert len({b.key for b in builds}) == len(LAUNCHES) and fresh_triton == []  # listing compiles nothing
    build_all(builds)
    assert len(fresh_triton) == len(LAUNCHES)
    constants = {c[2].get((3,)) for c in fresh_triton}
    assert 1 in constants  # n == 1 became a constexpr
    for description, args, options in LAUNCHES:
        assert cached(K.add_kernel, *args(x), **options), description
        K.add_kernel.warmup(*args(x), grid=(1,), **options)  # what a real launch looks up
    assert len(fresh_triton) == len(LAUNCHES)  # ... and it compiled nothing more
    if driver.compile_only():
        with pytest.raises(RuntimeError, match="never loaded or launched"):
            K.add_kernel[(1,)](x, x, x, 32, BLOCK=128)  # a real launch gets past the cache, to the (absent) GPU
        assert len(fresh_triton) == len(LAUNCHES)
    K.add_kernel.warmup(x, x, x, 48, grid=(1,), BLOCK=64)  # control: a variant nobody built does compile
    assert len(fresh_triton) == len(LAUNCHES) + 1


def test_a_build_with_a_stages_inspection_hook_set_compiles_what_the_launch_looks_up(fresh_triton, monkeypatch):
    """Triton 3.7 on keys a launch on a stages inspection hook's pipeline too; 3.6 does not (backends/triton/
    versions.py): a key that took it in, or left it out, on the wrong version would build a variant no launch
    finds."""
    from triton import knobs

    def hook(*compiling):  # run() asks it for (key, hash); the compiler calls it with its stages, to change none
        return None if compiling else ("buildops-test", "pipeline-hash")

    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", hook)
    x = torch.zeros(64)
    build_all(bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128))
    assert len(fresh_triton) == 1 and cached(K.add_kernel, x, x, x, 32, BLOCK=128)
    K.add_kernel.warmup(x, x, x, 32, grid=(1,), BLOCK=128)  # what a real launch looks up
    assert len(fresh_triton) == 1  # found: nothing compiled again


def test_options_order_is_part_of_the_key():
    x = torch.zeros(64)
    one = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128, num_warps=4)
    other = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128)
    assert one[0].key != other[0].key  # Triton keys the in-memory cache on the options as passed


def test_builds_from_specs_and_dtypes_equal_builds_from_tensors():
    x = torch.zeros(64, dtype=torch.float16)
    spec = buildops.TensorSpec((64,), torch.float16)
    from_tensors = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128)
    from_specs = bt.triton_builds("add", K.add_kernel, spec, spec, spec, 32, BLOCK=128)
    from_dtypes = bt.triton_builds("add", K.add_kernel, torch.float16, torch.float16, torch.float16, 32, BLOCK=128)
    assert from_tensors[0].key == from_specs[0].key == from_dtypes[0].key


def test_replay_lists_the_kernels_of_each_swept_shape(fresh_triton):
    with record_listings() as rec:
        assert torch.equal(K.double_rows(torch.ones(40, 100)), torch.zeros(40, 100))
    assert [d["x.0"] for d in rec.dims("double_rows")] == [1, 16, 64]
    labels = [b.label for listing in rec.of("double_rows") for b in listing.builds]
    assert labels == ["rows_kernel[fp32, n_rows=1, BLOCK_M=16, BLOCK_N=128]",  # a label per build
                      "rows_kernel[fp32, n_rows%16=0, BLOCK_M=16, BLOCK_N=128]",
                      "rows_kernel[fp32, n_rows%16=0, BLOCK_M=64, BLOCK_N=128]"]
    keys = rec.keys("double_rows")
    assert keys[0] != keys[1]  # n_rows == 1 specializes as a constexpr
    assert fresh_triton == [] and JITFunction.run is ORIGINAL_JIT_RUN  # nothing compiled, nothing left patched


def test_after_a_pass_the_op_compiles_nothing(fresh_triton):
    with build_pass("warmup"):
        K.double_rows(torch.zeros(40, 100))
    assert report().total("built") == 3 and len(fresh_triton) == 3
    for rows in (1, 16, 64):  # the launches the op will make at each swept shape
        block_m = 16 if rows <= 16 else 64
        K.rows_kernel.warmup(torch.zeros(rows, 100), torch.zeros(rows, 100), rows, 100, grid=(1,),
                             BLOCK_M=block_m, BLOCK_N=128)
    assert len(fresh_triton) == 3 and late_compiles() == []


def test_replay_builds_every_autotune_config_left_by_pruning(fresh_triton):
    with build_pass("warmup"):
        K.triple(torch.zeros(8))
    built = sorted((c[2][(3,)], c[2][(4,)]) for c in fresh_triton)  # (BLOCK, EVEN) of each compile
    # n=64: early pruning keeps BLOCK <= 256; n=1000: every config; EVEN from the heuristic
    assert built == [(64, False), (64, True), (256, False), (256, False), (1024, False)]
    tuner = K.scale_kernel
    for n in (64, 1000):
        x = torch.zeros(n)
        for config in record._configs_to_build(tuner, (x, x, n), {}):  # what autotuning will compile ...
            tuner.fn.warmup(x, x, n, grid=(1,), **config.all_kwargs())
    assert len(fresh_triton) == 5  # ... finds every config built


def test_builds_for_lists_from_meta_tensors_without_a_pass(fresh_triton):
    x = torch.empty(40, 100, device="meta")
    builds = K.double_rows.builds_for(x)  # what a family does: shapes known, no data, no pass
    with record_listings() as rec:
        K.double_rows(torch.ones(40, 100))
    assert [b.key for b in builds] == rec.keys("double_rows")
    assert buildops.report().total("listed") == 0 and fresh_triton == []  # returned, not queued or compiled


def test_replay_runs_on_meta_tensors_and_on_fake_ones_where_the_host_code_needs_the_device(fresh_triton,
                                                                                         monkeypatch):
    from torch._subclasses import fake_tensor

    modes = []
    original = fake_tensor.FakeTensorMode.__init__
    monkeypatch.setattr(fake_tensor.FakeTensorMode, "__init__", lambda self, *a, **k: modes.append(1) or
                        original(self, *a, **k))
    with record_listings() as rec:
        K.double_rows(torch.ones(40, 100))
    assert len(rec.keys("double_rows")) == 3 and modes == []  # meta tensors sufficed: no FakeTensorMode

    @buildops.lists_kernels(buildops.BuildConfig(buildops.DynamicSpec("x", 0, sweep=[16])), output="x")
    def cpu_only_rows(x):
        if x.device.type != "cpu":  # host code that reads the device: meta fails it, a fake CPU tensor passes
            raise RuntimeError("expected a CPU tensor")
        return K.double_rows.__wrapped__(x)

    with record_listings() as rec:
        cpu_only_rows(torch.ones(40, 100))
    assert [b.label for listing in rec.of("cpu_only_rows") for b in listing.builds] == [
        "rows_kernel[fp32, n_rows%16=0, BLOCK_M=16, BLOCK_N=128]"]
    assert modes == [1]


def test_an_autotuning_build_runs_the_tuner_on_zeros_shaped_like_the_launch(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(8, 64)[2:, ::2]  # strided, offset: the tuner must see the same layout
        scale = torch.empty(6)
    seen = []

    def tuner_run(tuner, *args, **kwargs):  # stands in for Autotuner.run, which needs a GPU to time on
        seen.append((args, kwargs))
        tuner.best_config = "best"

    tune = autotune._TuneRun(K.scale_kernel, (6, "torch.float32"), (autotune._Layout(x), x.shape[0], 7),
                             {"scale": autotune._Layout(scale), "grid": (1,)}, [], torch.device("cpu"), tuner_run)
    assert tune().value == "best"
    (args, kwargs), = seen
    assert (args[0].shape, args[0].stride(), args[0].storage_offset()) == ((6, 32), (64, 2), 128)
    assert args[0].count_nonzero() == 0 and not isinstance(args[0], FakeTensor)
    assert args[1:] == (6, 7) and kwargs["grid"] == (1,) and kwargs["scale"].shape == (6,)


def test_replay_of_host_code_that_needs_data_says_what_to_do():
    with pytest.raises(buildops.SpecError, match=r"replay of data_dependent at \{'x.0': 4\} failed: .*"
                                                 r"register a lister with @data_dependent.lister, or decorate"):
        with build_pass("warmup"):
            K.data_dependent(torch.ones(4))


def test_interception_is_only_on_the_replaying_thread(fresh_triton):
    inside, release = threading.Event(), threading.Event()
    x = torch.zeros(64)

    def host_code():
        with bt.recording("op") as builds:
            K.add_kernel[(1,)](x, x, x, 32, BLOCK=128)
            inside.set()
            assert release.wait(WAIT)
        return builds

    thread_result = {}
    thread = threading.Thread(target=lambda: thread_result.setdefault("builds", host_code()))
    thread.start()
    assert inside.wait(WAIT)
    K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=64)  # another thread, while recording: compiles for real
    release.set()
    thread.join(WAIT)
    assert len(thread_result["builds"]) == 1 and len(fresh_triton) == 1
    assert JITFunction.run is ORIGINAL_JIT_RUN


def test_a_late_compile_is_recorded_and_error_mode_raises():
    x = torch.zeros(64)
    K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=32)  # before any pass: not late
    with build_pass("warmup"):
        K.double_rows(torch.zeros(4, 8))
    assert late_compiles() == []
    K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=64)
    [late] = late_compiles()
    assert late.kernel == "triton_kernels.add_kernel" and late.library == "triton"
    assert "test_triton.py" in late.where
    # in the words of the builds' labels: constants by parameter name (n=16 is not one: 16 % 16 == 0 is)
    assert late.variant == "add_kernel[fp32, n:i32, BLOCK=64, warps=4, stages=3]", late.variant
    with settings.scope(late_compile="error"), pytest.raises(LateCompileError, match="late compile of triton kernel "
                                                                                   "triton_kernels.add_kernel"):
        K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=128)
    with settings.scope(late_compile="ignore"):
        K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=256)
    assert len(late_compiles()) == 3
    rep = report()
    assert rep.coverage() == {"triton": (3, 3)}  # double_rows' three variants, and three late
    assert "triton: 3 kernel(s) prebuilt (3 compiled, 0 found cached), 3 compiled late" in rep.format()


def test_a_late_compile_names_the_op_that_listed_the_kernel():
    with build_pass("warmup"):
        K.double_rows(torch.zeros(4, 8))
    x = torch.zeros(4, 8)
    K.rows_kernel.warmup(x, x, 4, 8, grid=(1,), BLOCK_M=32, BLOCK_N=8)  # a variant the op never lists
    [late] = late_compiles()
    assert late.ops == ("double_rows",) and "listed by double_rows" in late.describe()


# -- worker processes -----------------------------------------------------------------------------------------

@pytest.fixture
def parent_compiles():
    """Compiles in this process, each as True (a real compile) or False (loaded from the disk cache)."""
    events = []
    previous = knobs.compilation.listener
    knobs.compilation.listener = lambda *, cache_hit, **_: events.append(not cache_hit)
    yield events
    knobs.compilation.listener = previous


def test_worker_processes_build_into_the_cache_and_the_parent_compiles_nothing(fresh_triton, parent_compiles):
    with settings.scope(executor="processes", threads=2), build_pass("warmup"):
        K.double_rows(torch.zeros(40, 100))
    assert report().total("built") == 3 and report().total("failed") == 0
    assert parent_compiles == [False, False, False]  # the parent only loaded what the workers compiled
    x = torch.zeros(16, 100)
    K.rows_kernel.warmup(x, x, 16, 100, grid=(1,), BLOCK_M=16, BLOCK_N=128)
    assert len(fresh_triton) == 3 and parent_compiles == [False] * 3  # and later finds it in memory


def test_a_build_reaches_its_worker_before_this_process_hashes_triton(monkeypatch):
    steps = []  # the hash is only for this process's warmup; the first builds of a start used to wait for it
    monkeypatch.setattr(triton_build, "compile_shipped", lambda *args: steps.append("worker compiles"))
    monkeypatch.setattr(triton_build, "hash_triton_install", lambda: steps.append("this process hashes Triton"))
    x = torch.zeros(64)
    [build] = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=128)
    with settings.scope(executor="processes"):
        build.run()
    assert steps == ["worker compiles", "this process hashes Triton"]


WARM_FORK = r"""
import os
from buildops.backends.triton import worker as W

W.warm_up_compiler()  # what the forkserver does before it forks a worker: a real compile, for cuda:90
compiles = []
W._compile_a_small_kernel = lambda: compiles.append(1)
pid = os.fork()
if pid == 0:  # a worker forked from it
    W.start()  # the pool's initializer, for the same target: nothing to pay
    first = len(compiles)
    W.start("cuda", 80, 32)  # another target: it compiles one
    os._exit(0 if (first, len(compiles)) == (0, 1) else 1)
_, status = os.waitpid(pid, 0)
print("forked warm" if os.waitstatus_to_exitcode(status) == 0 else "the worker compiled at start")
"""


def test_a_worker_forked_warm_compiles_nothing_more_before_its_first_build(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", WARM_FORK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["forked", "warm"], done.stderr[-3000:]


KERNELS_THAT_NOTE_THEIR_IMPORT = """\
import os
import triton
import triton.language as tl

with open(os.environ["IMPORTED_BY"], "a") as log:  # who imported this module: the parent, or a worker too?
    log.write(f"{os.getpid()}\\n")

SCALE = tl.constexpr(3)


@triton.jit
def _scaled(x):
    return x * SCALE


@triton.jit
def copy(x, y, BLOCK: tl.constexpr):
    tl.store(y + tl.arange(0, BLOCK), _scaled(tl.load(x + tl.arange(0, BLOCK))))
"""


def _module_from(path, name):
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_worker_builds_a_kernel_from_its_source_without_importing_its_module(tmp_path, monkeypatch,
                                                                              parent_compiles):
    import sys
    (tmp_path / "noted_kernels.py").write_text(KERNELS_THAT_NOTE_THEIR_IMPORT)
    monkeypatch.setenv("IMPORTED_BY", str(tmp_path / "imported_by"))
    monkeypatch.syspath_prepend(str(tmp_path))  # a worker could import it by name: it must not need to
    module = _module_from(tmp_path / "noted_kernels.py", "noted_kernels")
    try:
        x = torch.zeros(64)
        [build] = bt.triton_builds("copy", module.copy, x, x, BLOCK=64)
        with settings.scope(executor="processes", threads=1):
            buildops._core.default.default_builder().submit(build).result(WAIT * 6)
        assert parent_compiles == [False]  # a worker compiled it: the parent's own warmup was a disk-cache hit
        [record] = report().builds
        assert record.where is None and record.cached is False
        assert (tmp_path / "imported_by").read_text().split() == [str(os.getpid())]  # by no worker
    finally:
        del sys.modules["noted_kernels"]


def test_a_kernel_whose_source_cannot_travel_is_built_where_it_can_and_the_report_says_why(tmp_path,
                                                                                           parent_compiles):
    import enum
    import sys
    source = tmp_path / "hidden_kernels.py"
    source.write_text("import enum\nimport triton\nimport triton.language as tl\n\n"
                      "class Mode(enum.Enum):\n    COPY = 1\n\n"
                      "MODE = tl.constexpr(Mode.COPY)\n\n"
                      "@triton.jit\ndef copy(x, y, BLOCK: tl.constexpr):\n"
                      "    if MODE == MODE:\n"
                      "        tl.store(y + tl.arange(0, BLOCK), tl.load(x + tl.arange(0, BLOCK)))\n")
    # Importable here by name, but not by a worker (its file is off sys.path); its constexpr is of a class of its
    # own, which a worker could unpickle only by importing it.
    module = _module_from(source, "hidden_kernels_for_buildops_test")
    assert isinstance(module.Mode.COPY, enum.Enum)
    try:
        x = torch.zeros(64)
        [build] = bt.triton_builds("copy", module.copy, x, x, BLOCK=64)
        with settings.scope(executor="processes", threads=1):
            buildops._core.default.default_builder().submit(build).result(WAIT * 6)
        assert parent_compiles == [True]  # compiled here, in the builder's thread
        [record] = report().builds
        where = record.where
        assert where.startswith("this process (") and "reads MODE" in where and "import" in where
        [line] = [text for text in report().format().splitlines() if "compiled in" in text]
        assert line.startswith("triton: 1 build(s) compiled in this process (") and "reads MODE" in line
    finally:
        del sys.modules["hidden_kernels_for_buildops_test"]


def test_a_worker_killed_mid_build_does_not_hang_the_pass(fresh_triton, caplog, monkeypatch):
    killed, sent = [], threading.Event()
    run = triton_workers.run

    def run_noted(*args, **kwargs):  # a build is about to go to a worker, the pool started and warm
        triton_workers.get()
        sent.set()
        return run(*args, **kwargs)

    monkeypatch.setattr(triton_workers, "run", run_noted)

    def kill_the_workers_once_one_builds():
        if not sent.wait(WAIT * 6):
            return
        time.sleep(0.05)  # into the worker's compile, which takes far longer
        pool = triton_workers._pool
        processes = list(getattr(pool, "_processes", None) or {}) if pool else []
        for pid in processes:
            os.kill(pid, signal.SIGKILL)
        killed.extend(processes)

    killer = threading.Thread(target=kill_the_workers_once_one_builds)
    with settings.scope(executor="processes", threads=1):
        killer.start()
        with build_pass("warmup"):
            K.double_rows(torch.zeros(20, 100))
    killer.join(WAIT)
    assert killed and "worker crashed" in caplog.text
    rep = report()
    assert (rep.total("built"), rep.total("failed"), rep.total("pending")) == (3, 0, 0)  # retried in a new worker


def test_auto_builds_in_workers_on_many_cores_and_in_threads_on_few(monkeypatch, parent_compiles):
    with settings.scope(executor="auto", threads=1):
        monkeypatch.setattr(buildops._config, "AUTO_PROCESSES_FROM_CPUS", 10_000)  # a machine with few cores
        with build_pass("few cores"):
            K.double_rows(torch.zeros(4, 8))
        assert not triton_workers.started and parent_compiles == [True] * 3  # compiled in the builder's thread
        parent_compiles.clear()
        monkeypatch.setattr(buildops._config, "AUTO_PROCESSES_FROM_CPUS", 1)  # a machine with many cores
        with build_pass("many cores"):
            K.double_rows(torch.zeros(40, 100))
        assert triton_workers.started and report().total("failed") == 0
    assert parent_compiles == [False] * 3  # the workers compiled them; this process loaded them


def _kernel_with(signature):
    from types import SimpleNamespace
    return SimpleNamespace(src=SimpleNamespace(signature=signature), metadata=SimpleNamespace(), name="k")


def test_threads_make_a_shared_launcher_one_at_a_time_and_other_launchers_beside_it(monkeypatch):
    from types import SimpleNamespace
    # Up to Triton 3.6 each launcher is a host-compiler build; threads that made one together each built it.
    inside = {"A": 0, "B": 0}
    most = {"A": 0, "B": 0}
    entered = {"A": threading.Event(), "B": threading.Event()}
    lock = threading.Lock()

    def make(src, metadata):
        kind = "A" if "i32" in src.signature.values() else "B"
        with lock:
            inside[kind] += 1
            most[kind] = max(most[kind], inside[kind])
        entered[kind].set()
        entered["B" if kind == "A" else "A"].wait(WAIT)  # a launcher of the other signature is made meanwhile
        time.sleep(0.02)
        with lock:
            inside[kind] -= 1

    monkeypatch.setattr(driver, "driver", SimpleNamespace(active=SimpleNamespace(launcher_cls=make)))
    # Variants and kernels that differ in constants, argument names or pointer types share a launcher; i64 makes
    # another one.
    kernels = [_kernel_with({"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}) for _ in range(3)]
    kernels += [_kernel_with({"y": "*fp32", "m": "i32", "B": "constexpr"})]
    kernels += [_kernel_with({"x": "*bf16", "n": "i32", "BLOCK": "constexpr"})]  # all pointers pass alike
    kernels += [_kernel_with({"x": "*bf16", "m": "i64", "BLOCK": "constexpr"}) for _ in range(3)]
    start = threading.Barrier(len(kernels))
    threads = [threading.Thread(target=lambda k=k: (start.wait(WAIT), triton_build._make_launcher(k))) for k in kernels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert most == {"A": 1, "B": 1}
    assert entered["A"].is_set() and entered["B"].is_set()
    assert len({versions.launcher_signature(k) for k in kernels}) == 2


def test_a_forked_child_gets_every_lock_of_the_triton_module_free():
    names = [(triton_build, "_load_lock"), (triton_build, "_triton_key_lock"), (driver, "_driver_lock"),
             (patches, "_module_load_lock"), (patches, "_parse_lock")]
    names += [(triton_state, name) for name in ("prepare_lock", "serving_lock", "tunings_queued_lock", "listed_lock",
                                                "launcher_locks_lock", "build_patches_lock", "interpreter_patch_lock")]
    free = in_a_child_forked_while_held(
        lambda: holding(*(getattr(module, name) for module, name in names)),
        lambda: all(getattr(module, name).acquire(timeout=1) for module, name in names))
    assert free


def test_threads_parsing_kernels_at_once_never_fail():
    import gc
    import threading as _threading
    # A collection mid-parse hands the GIL over (as a __del__ that runs then does): another thread's parse in
    # between broke Python's shared recursion-depth count (SystemError) before buildops parsed one at a time.
    errors, threshold = [], gc.get_threshold()
    handover = lambda phase, info: time.sleep(0)  # noqa: E731
    gc.callbacks.append(handover)
    gc.set_threshold(50)
    try:
        def parse_many():
            for _ in range(100):
                try:
                    K.add_kernel.parse(), K.rows_kernel.parse()
                except SystemError as error:
                    errors.append(error)
        threads = [_threading.Thread(target=parse_many) for _ in range(8)]
        with patches.building():  # as while builds run
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT * 6)
    finally:
        gc.callbacks.remove(handover)
        gc.set_threshold(*threshold)
    assert errors == []


_LAUNCHER_SOURCE = """
#include <Python.h>
static PyObject* launch(PyObject* self, PyObject* args) { return PyUnicode_FromString("%s"); }
static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "__triton_launcher", NULL, -1, methods};
PyMODINIT_FUNC PyInit___triton_launcher(void) { return PyModule_Create(&module); }
"""


def test_a_launcher_loaded_again_leaves_the_other_signatures_launcher_alone(tmp_path, monkeypatch):
    """Up to Triton 3.6 every signature's launcher is a C module named "__triton_launcher": loading signature A's a
    second time used to fill in the module in sys.modules, signature B's, with A's launch (what a thread that had
    just loaded B then called)."""
    import shutil

    build = pytest.importorskip("triton.runtime.build")
    if not hasattr(build, "compile_module_from_src") or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("this Triton compiles no helper modules here, or no C compiler")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))

    def launcher(signature: str):
        return build.compile_module_from_src(_LAUNCHER_SOURCE % signature, "__triton_launcher")

    with patches.building():  # as while builds run
        a, b = launcher("A"), launcher("B")
        assert (a.launch(), b.launch()) == ("A", "B")
        again = launcher("A")  # from Triton's cache now
        assert (again.launch(), b.launch(), a.launch()) == ("A", "B", "A")
        assert "__triton_launcher" not in sys.modules
    c = launcher("C")  # the engine's own first launch, outside a build: left in sys.modules
    with patches.building():
        assert launcher("A").launch() == "A"  # a build loads A's again: C's module is not the one refilled
    assert c.launch() == "C"


CHANGING_KERNEL = """
import enum

import triton
import triton.language as tl

class Mode(enum.Enum):  # a class of the user's: the kernel does not travel as source, a worker imports it by name
    ON = 1

MODE = tl.constexpr(Mode.ON)

@triton.jit
def scale(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    if MODE == MODE:
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * {scale}, mask=offsets < n)
"""


def test_a_kernel_file_changed_after_import_is_built_here_and_the_report_says_why(tmp_path, monkeypatch, caplog):
    """A worker that imports a kernel by name finds other source where its file changed after this process
    imported it: it compiles nothing, and this process builds the kernel it runs (issue 33, 2c)."""
    import importlib
    import logging

    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "changing_kernel.py"
    path.write_text(CHANGING_KERNEL.format(scale=2))
    module = importlib.import_module("changing_kernel")
    path.write_text(CHANGING_KERNEL.format(scale=3))  # edited after the import
    x = torch.zeros(64)
    [build] = bt.triton_builds("scale", module.scale, x, 64, BLOCK=64)
    with settings.scope(executor="processes"), caplog.at_level(logging.WARNING, logger="buildops"):
        outcome = build.run()
    assert "its file changed since; built in this process" in caplog.text, outcome.where
    assert "a worker imported other source" in outcome.where
