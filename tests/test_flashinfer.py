"""FlashInfer module builds for sm_90, compiled for real with nvcc on a machine without a GPU, and variant replay of
a real FlashInfer wrapper's plan()."""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import buildops
from buildops import build_pass, report

from conftest import WAIT


def _cuda_home():
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda-13.0", "/usr/local/cuda"):
        if candidate and Path(candidate, "bin", "nvcc").exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def flashinfer_env(tmp_path_factory):
    """FlashInfer set up to build for sm_90 here: settings it reads at import, a stub libcuda to link against, and
    the environment's own ninja first on PATH (a module must be built and loaded by the same ninja)."""
    pytest.importorskip("flashinfer", reason="FlashInfer is an optional dependency (./scripts/test installs it)")
    cuda_home = _cuda_home()
    if cuda_home is None:
        pytest.skip("needs nvcc (CUDA_HOME or /usr/local/cuda-13.0) to build FlashInfer modules")
    base = tmp_path_factory.mktemp("flashinfer")
    stub = base / "stub"
    stub.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-x", "c", "-", "-o",
                    str(stub / "libcuda.so")], input=b"void cuGetErrorString(void){}\n", check=True)
    env = {"FLASHINFER_CUDA_ARCH_LIST": "9.0", "FLASHINFER_WORKSPACE_BASE": str(base / "workspace"),
           "CUDA_HOME": cuda_home, "FLASHINFER_EXTRA_LDFLAGS": f"-L{stub}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import flashinfer  # noqa: F401  (reads the settings above)
    yield base
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _outputs(spec):
    return {p: p.stat().st_mtime_ns for p in [Path(spec.jit_library_path), *Path(spec.build_dir).glob("*.o")]}


def test_an_op_lists_a_module_that_builds_unloaded_and_later_loads_without_compiling(flashinfer_env):
    import flashinfer.activation
    from flashinfer.jit.activation import gen_act_and_mul_module

    from flashinfer_ops import silu_and_mul

    with build_pass("warmup"):
        silu_and_mul(torch.zeros(4, 256, dtype=torch.float16))
    spec = gen_act_and_mul_module("silu")
    assert report().total("built") == 1 and report().coverage() == {"flashinfer": (1, 0)}
    built = _outputs(spec)
    assert Path(spec.jit_library_path).exists() and len(built) == 2  # the .so and its object: nvcc ran here
    assert flashinfer.activation.get_act_and_mul_module.cache_info().currsize == 0  # built, not loaded

    load = textwrap.dedent("""
        from flashinfer.jit.activation import gen_act_and_mul_module
        gen_act_and_mul_module("silu").build_and_load()
    """)
    subprocess.run([sys.executable, "-c", load], check=True, timeout=300)  # FlashInfer's own first use ...
    assert _outputs(spec) == built  # ... found everything up to date: nothing compiled, nothing relinked

    spec.build_and_load()  # here too: up to date, so not a late compile
    assert buildops.late_compiles() == []
    Path(spec.jit_library_path).unlink()  # a module that must be (re)linked on first use ...
    spec.build_and_load()
    [late] = buildops.late_compiles()  # ... is a late compile, named with where it came from
    assert (late.library, late.kernel) == ("flashinfer", spec.name) and "test_flashinfer.py" in late.where


def test_two_processes_building_one_module_build_it_once(flashinfer_env, tmp_path):
    launcher, log = tmp_path / "nvcc-launcher", tmp_path / "nvcc-calls"
    launcher.write_text(f'#!/bin/sh\necho "$$" >> {log}\nexec "$@"\n')
    launcher.chmod(0o755)
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "workspace"),
           "FLASHINFER_NVCC_LAUNCHER": str(launcher)}
    build = textwrap.dedent("""
        from flashinfer.jit.activation import gen_act_and_mul_module
        from buildops.backends.flashinfer import module_builds
        [build] = module_builds("gelu", [gen_act_and_mul_module("gelu_tanh")])
        print(build.run().value)
    """)
    processes = [subprocess.Popen([sys.executable, "-c", build], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    assert outputs[0] == outputs[1] and outputs[0].strip().endswith(".so")
    assert len(log.read_text().splitlines()) == 1  # one nvcc run in all: the second process found it built


# -- sharing through the build store ------------------------------------------------------------------------------

def _run_node(name, tmp_path, store, *args):
    """One node (tests/flashinfer_node.py) in a process of its own, with its own FlashInfer workspace; each nvcc it
    runs adds a line to tmp_path/nvcc-calls."""
    launcher = tmp_path / "nvcc-launcher"
    if not launcher.exists():
        launcher.write_text(f'#!/bin/sh\necho "$$" >> {tmp_path / "nvcc-calls"}\nexec "$@"\n')
        launcher.chmod(0o755)
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / name), "BUILDOPS_STORE": store,
           "BUILDOPS_NODE_LOCKS": str(tmp_path / name / "node-locks"), "FLASHINFER_NVCC_LAUNCHER": str(launcher)}
    node = subprocess.run([sys.executable, str(Path(__file__).with_name("flashinfer_node.py")), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert node.returncode == 0, node.stderr[-4000:]
    summary = json.loads(node.stdout.splitlines()[-1])
    assert summary["buildops"] == buildops.__file__  # the buildops under test, not another install
    return summary


def _nvcc_runs(tmp_path):
    calls = tmp_path / "nvcc-calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_a_module_one_node_built_is_fetched_by_another_which_compiles_it_nowhere(flashinfer_env, redis_url,
                                                                                 tmp_path):
    a = _run_node("a", tmp_path, redis_url)
    assert (a["store"]["stored"], a["cached"], a["origin"], _nvcc_runs(tmp_path)) == (1, False, None, 1)

    b = _run_node("b", tmp_path, redis_url)  # an empty JIT dir: it fetches A's library ...
    assert (b["origin"], b["store"]["fetched"], b["store"]["stored"]) == ("store", 1, 0)
    assert b["library"] == a["library"] and b["objects"] == []  # ... and compiles nothing, in its build ...
    assert b["first_call_left_library"] and b["late"] == []  # ... nor in the op's first call (build_and_load)
    assert b["cached"] is True and (b["coverage"]["compiled"], b["coverage"]["cached"]) == (0, 1)
    assert _nvcc_runs(tmp_path) == 1

    restart = _run_node("b", tmp_path, redis_url)  # its library is known: the store is not asked, nothing compiles
    assert (restart["store"]["known_locally"], restart["store"]["fetched"], restart["cached"]) == (1, 0, True)
    assert restart["late"] == [] and _nvcc_runs(tmp_path) == 1

    tampered = _run_node("b", tmp_path, redis_url, "tamper")  # a library changed on disk is not A's any more:
    assert tampered["cached"] is False and tampered["objects"] != []  # FlashInfer's ninja builds the module
    assert tampered["library"] != a["library"] and _nvcc_runs(tmp_path) == 2


@pytest.fixture
def jit_dir(flashinfer_env, tmp_path, monkeypatch):
    """A JIT dir of the test's own (FlashInfer reads it from its env module at each use), and FlashInfer's ninja
    replaced by a stand-in that records its runs and writes the module's library: an install's effect on
    FlashInfer's build shows without compiling."""
    from flashinfer.jit import core, env

    monkeypatch.setattr(env, "FLASHINFER_JIT_DIR", tmp_path / "jit")
    ninja_runs = []

    def run_ninja(workdir, *args, **kwargs):
        ninja_runs.append(workdir)
        Path(workdir, f"{Path(workdir).name}.so").write_bytes(b"built by ninja")

    monkeypatch.setattr(core, "run_ninja", run_ninja)
    return ninja_runs


def _installed_silu():
    from flashinfer.jit.activation import gen_act_and_mul_module

    from buildops.backends.flashinfer.store import FlashInferModule

    spec = gen_act_and_mul_module("silu")
    module = FlashInferModule(spec)
    module.install({"silu_and_mul.so": b"fetched library"})
    return spec, module, Path(spec.jit_library_path)


def test_an_installed_module_is_built_by_no_ninja_until_its_library_changes(jit_dir):
    spec, module, library = _installed_silu()
    assert library.read_bytes() == b"fetched library" and os.access(library, os.X_OK)
    assert module.known_locally() and [p.name for p in library.parent.iterdir()] == [library.name]
    spec.build()
    assert jit_dir == [] and not Path(spec.ninja_path).exists()  # FlashInfer's build returned before ninja

    library.write_bytes(b"changed since")
    assert not module.known_locally()
    spec.build()
    assert len(jit_dir) == 1 and library.read_bytes() == b"built by ninja"  # FlashInfer's own build again


def test_a_tampered_marker_leaves_the_module_to_ninja(jit_dir):
    from buildops.backends.flashinfer.store import MARKERS

    spec, module, library = _installed_silu()
    marker = library.parent.parent / MARKERS / module.identity()
    assert marker.read_text() == hashlib.sha256(b"fetched library").hexdigest()
    marker.write_text(hashlib.sha256(b"another library").hexdigest())
    assert not module.known_locally()
    spec.build()
    assert len(jit_dir) == 1


def test_an_install_never_replaces_a_library_that_is_there(jit_dir):
    from flashinfer.jit.activation import gen_act_and_mul_module

    from buildops.backends.flashinfer.store import FlashInferModule

    spec = gen_act_and_mul_module("silu")
    library = Path(spec.jit_library_path)
    library.parent.mkdir(parents=True)
    library.write_bytes(b"the user's own library")
    module = FlashInferModule(spec)
    module.install({"silu_and_mul.so": b"fetched library"})
    assert library.read_bytes() == b"the user's own library" and not module.known_locally()
    spec.build()
    assert len(jit_dir) == 1  # left to FlashInfer's ninja, which decides whether it is up to date


@pytest.mark.parametrize("late_watch_first", [True, False])
def test_the_install_skip_and_the_late_compile_watch_compose_and_both_go_at_reset(jit_dir, late_watch_first):
    from flashinfer.jit.core import JitSpecNvcc

    from buildops._core import late
    from buildops.backends.flashinfer import watch_late_compiles
    from buildops.testing import reset

    original = JitSpecNvcc.__dict__["build"]
    if late_watch_first:
        watch_late_compiles()
    spec, _, library = _installed_silu()
    watch_late_compiles()
    late.arm()  # as at the end of a pass
    spec.build()
    assert jit_dir == [] and buildops.late_compiles() == []
    library.unlink()  # not placed any more: FlashInfer builds it, and the watch sees it
    spec.build()
    assert len(jit_dir) == 1 and [c.kernel for c in buildops.late_compiles()] == [spec.name]
    reset()
    assert JitSpecNvcc.__dict__["build"] is original


@contextlib.contextmanager
def cpu_machine_shims():
    """Let a FlashInfer wrapper's plan() run on CPU tensors on a machine without a GPU: these stand in for the
    device queries and the pinned-memory allocator that a GPU machine has. (Test scaffolding, not buildops.)"""
    import flashinfer.utils as futils
    saved = []

    def patch(owner, name, value):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    fakes = {"get_compute_capability": lambda device: (9, 0), "get_device_sm_count": lambda device: 132}
    originals = {name: getattr(futils, name) for name in fakes}
    for module in [m for name, m in sys.modules.items() if name.startswith("flashinfer")]:
        for name, fake in fakes.items():
            if getattr(module, name, None) is originals[name]:
                patch(module, name, fake)
    patch(torch.version, "cuda", "12.8")
    for name in ("empty", "zeros"):
        original = getattr(torch, name)
        patch(torch, name, lambda *a, _original=original, **k: _original(*a, **{**k, "pin_memory": False}))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        for name in dir(futils):
            cached = getattr(futils, name)
            if name.startswith("is_sm") and hasattr(cached, "cache_clear"):
                cached.cache_clear()


def test_replaying_a_decode_plan_lists_its_module_without_building_it(flashinfer_env):
    import flashinfer
    import flashinfer.decode

    from buildops.backends.flashinfer import PLAN_LOOKUPS
    from buildops.backends.variants import variants

    getter = flashinfer.decode.get_batch_decode_module
    workspace = torch.empty(128 << 20, dtype=torch.uint8)
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    with cpu_machine_shims(), variants("decode", *PLAN_LOOKUPS) as builds:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(i32(0, 2, 5), torch.arange(5, dtype=torch.int32), i32(3, 7), 32, 8, 128, 16,
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    [build] = builds
    assert build.label.startswith("get_batch_decode_module(") and build.library == "flashinfer"
    assert (build.run.func, build.run.args[0], build.run.args[4]) == (getter, torch.bfloat16, 128)  # dtype, head dim
    assert flashinfer.decode.get_batch_decode_module is getter  # the plan's lookup is the real one again
    assert getter.cache_info().currsize == 0  # and nothing fake was ever cached in it
    assert not any(Path(flashinfer_env).rglob("batch_decode_*.so"))  # nothing was built inline


def test_an_engines_replayed_plans_ask_for_the_modules_its_serving_plans_ask_for(flashinfer_env):
    """The family of tests/flashinfer_serving.py (run on a GPU by test_flashinfer_gpu.py): its replay on dummy
    batches records the lookups that the serving batches' plans make, with the same arguments."""
    from buildops.backends.flashinfer import PLAN_LOOKUPS
    from buildops.backends.variants import variants

    from paged_attention import DECODE, PREFILL, AttentionConfig, AttentionPlans, PagedAttention, paged_batch

    with cpu_machine_shims():
        engine = PagedAttention(AttentionConfig(), "cpu")
        replayed = list(AttentionPlans().builds(engine, engine.config))
        with variants("serving", *PLAN_LOOKUPS) as serving:
            engine.plan_prefill(paged_batch(PREFILL, 16, seed=1))
        with variants("serving", *PLAN_LOOKUPS) as more:
            engine.plan_decode(paged_batch(DECODE, 16, seed=2))
    assert [b.key for b in replayed] == [b.key for b in serving + more]  # ("variant", lookup, args, kwargs)
    assert [b.key[1] for b in replayed] == ["flashinfer.prefill.get_batch_prefill_module",
                                            "flashinfer.decode.get_batch_decode_module"]
    prefill, decode = (b.run.args for b in replayed)
    assert prefill[:2] == ("fa3", torch.bfloat16) and 128 in prefill  # SM90, a query over 64 tokens: FA3
    assert decode[0] == torch.bfloat16 and decode[4] == 128  # dtype, head dim
    assert not any(Path(flashinfer_env).rglob("batch_*.so"))  # nothing was built


def test_variants_leave_other_threads_their_real_lookup():  # needs no FlashInfer
    import threading

    from buildops.backends.variants import variants

    seen = []
    inside, release = threading.Event(), threading.Event()

    def plan():
        with variants("op", "os.path.join") as builds:
            inside.set()
            release.wait(WAIT)
            os.path.join("a", "b")  # recorded, and ends the block
            seen.append("not reached")
        seen.append(builds)

    thread = threading.Thread(target=plan)
    thread.start()
    assert inside.wait(WAIT)
    assert os.path.join("x", "y") == "x/y"  # another thread, during the recording: the real function
    release.set()
    thread.join(WAIT)
    [builds] = seen
    assert len(builds) == 1 and builds[0].run() == "a/b" and os.path.join.__module__ == "posixpath"


def test_variants_with_a_bad_lookup_patch_nothing():  # needs no FlashInfer
    import json

    from buildops.backends.variants import variants

    dumps = json.dumps
    with pytest.raises(ValueError, match="module json has no 'no_such_lookup'"):
        with variants("op", "json.dumps", "json.no_such_lookup"):
            pass
    assert json.dumps is dumps  # the good lookup before the bad one was not left patched
