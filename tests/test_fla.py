"""buildops on a kernel library written elsewhere: flash-linear-attention's Triton kernels (``fla-core``), decorated
from outside in ``examples/fla_lm``."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import buildops
from buildops.testing import record_listings

pytest.importorskip("fla")
warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla, on a CPU

# fla picks its device from Triton's active driver as it is imported: imported before any test installs buildops'
# compile-only driver (a CPU machine has none), it sees no GPU, as it should here.
from examples.fla_lm import ops as _fla_ops  # noqa: E402
from examples.fla_lm.model import Config, Model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_a_pass_lists_every_fla_op_at_every_swept_token_count():
    model = Model(Config(layers=1, hidden=128, heads=2, mlp=256)).to(torch.bfloat16)
    with torch.no_grad(), record_listings() as rec:
        logits = model(torch.zeros(64, dtype=torch.long))
    assert logits.shape == (64, 1024) and not logits.any()  # placeholders, nothing ran
    assert rec.ops() == ["rms_norm", "simple_gla", "swiglu"]
    powers = [1, 2, 4, 8, 16, 32, 64]
    assert sorted({d["x.0"] for d in rec.dims("rms_norm")}) == powers
    assert sorted({d["q.1"] for d in rec.dims("simple_gla")}) == powers
    kernels = {key[1].rpartition(".")[2] for key in rec.keys() if key[0] == "triton"}  # noqa: SIM118 - not a dict
    assert {"layer_norm_fwd_kernel", "swiglu_fwd_kernel"} <= kernels  # fla's own kernels, found in fla's code
    assert len([k for k in kernels if "chunk" in k]) >= 3  # the chunked attention's several kernels


def test_a_pass_compiles_fla_kernels_with_no_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    model = Model(Config(layers=1, hidden=128, heads=2, mlp=256)).to(torch.bfloat16)
    with torch.no_grad(), buildops.build_pass("warmup"):
        model(torch.zeros(16, dtype=torch.long))
    report = buildops.report()
    assert {op.op for op in report.ops} == {"rms_norm", "simple_gla", "swiglu"}
    assert report.failures == () and report.total("failed") == 0
    assert report.total("built") == len({b.build.key for b in report.builds}) > 20


@pytest.mark.gpu
def test_after_one_pass_fla_ops_compile_nothing_and_match_a_run_without_buildops(tmp_path):
    """The example's requests run at token counts within the sweep with late compiles as errors, and their logits
    match a run without buildops (its own Triton cache: every kernel compiled on first use, autotuned on data)."""
    def run(name: str, **env: str) -> torch.Tensor:
        out = tmp_path / f"{name}.pt"
        environ = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / f"{name}-cache"), **env}
        done = subprocess.run([sys.executable, "-m", "examples.fla_lm", "--save", str(out)], cwd=ROOT, env=environ,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return torch.load(out)

    with_buildops, without = run("buildops"), run("lazy", BUILDOPS="0")
    assert len(with_buildops) == len(without) == 5
    for ours, theirs in zip(with_buildops, without):
        # Autotuning on zeros may pick another config than autotuning on data: bf16 sums in another order.
        torch.testing.assert_close(ours, theirs, atol=0.05, rtol=0.02)


def test_every_fla_kernel_the_example_reaches_travels_to_a_worker_as_source():
    """Built in worker processes, fla's kernels reach them as source: no worker imports fla (or torch) to build
    them, and each rebuilt kernel has the cache key this process computed."""
    from test_shipping import rebuilt_elsewhere

    from buildops.backends.triton.driver import inner_jit
    from buildops.backends.triton.shipping import ShippedKernel, describe

    model = Model(Config(layers=1, hidden=128, heads=2, mlp=256)).to(torch.bfloat16)
    with torch.no_grad(), record_listings() as rec:
        model(torch.zeros(16, dtype=torch.long))
    names = {key[1] for key in rec.keys() if key[0] == "triton"}  # noqa: SIM118 - "module.qualname" of each kernel
    kernels = [inner_jit(_resolve(name)) for name in sorted(names)]
    described = [describe(jit) for jit in kernels]
    assert len(described) >= 5 and all(isinstance(d, ShippedKernel) for d in described), described
    keys, imported = rebuilt_elsewhere(described)
    assert keys == [jit.cache_key for jit in kernels] and imported == []


def test_a_pass_in_worker_processes_builds_fla_kernels_without_importing_fla_there(tmp_path, monkeypatch):
    from buildops.backends.triton.worker import workers

    import pool_tasks

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    with buildops.settings.scope(executor="processes", threads=2), buildops.build_pass("warmup"):
        _fla_ops.rms_norm(x, torch.ones(128, dtype=torch.bfloat16))  # fla's norm and activation: a few kernels
        _fla_ops.swiglu(x, x)
    report = buildops.report()
    assert report.failures == () and report.total("built") >= 3
    assert [b.where for b in report.builds if b.where] == []  # every build from source, in a worker
    assert workers.run("probe", pool_tasks.imported, "fla") == []


def _resolve(name: str):
    """The object ``module.qualname`` names, the module being the longest importable prefix."""
    import importlib
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise LookupError(name)
