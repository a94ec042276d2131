"""The walkthrough backend of docs/backends/writing-a-backend.md, end to end: ``shelljit`` (tests/shelljit.py), whose
kernels compile by running a shell command, registered by tests/shelljit_backend.py and changed nowhere else. Its
kernels are listed by replay in a pass and built by the builder; serving compiles none of them, and a kernel the
pass did not list is reported late; a second node fetches them from the build store; a manifest prebuilds them on a
machine that never ran the pass; the report and ``buildops doctor`` show the backend."""

import json

import pytest
import shelljit
import shelljit_backend
import torch

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, lists_kernels, report
from buildops._core.state import core
from buildops._doctor import diagnose
from buildops.manifests import load_manifest, prebuild, save_manifest
from buildops.testing import reset

KERNELS = ["scale1", "scale2", "scale4"]


@pytest.fixture
def node(monkeypatch, tmp_path):
    """Registers the backend (undone after the test); ``node(name)`` makes the process a node of its own: its
    own shelljit cache and node locks, a fresh builder."""
    monkeypatch.setattr(core, "backends", dict(core.backends))
    shelljit_backend.register()

    def become(name):
        reset()
        monkeypatch.setenv("SHELLJIT_CACHE_DIR", str(tmp_path / name / "cache"))
        monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / name / "locks"))
        shelljit.compiles.clear()
        return tmp_path / name / "cache"

    return become


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[1, 2, 4])), output="x")
def scale(x):
    rows = x.shape[0]
    return shelljit.launch(f"scale{rows}", f"printf 'scale by {rows}'", x)


def test_a_pass_builds_its_kernels_and_serving_compiles_none_of_them(node):
    node("a")
    with build_pass("warmup"):
        scale(torch.ones(4, 2))
    assert sorted(shelljit.compiles) == KERNELS
    assert "shelljit: 3 kernel(s) prebuilt (3 compiled, 0 found cached), 0 compiled late" in report().format()
    assert scale(torch.ones(2, 2)).tolist() == [[11.0, 11.0]] * 2  # len(b"scale by 2") added, nothing compiled
    assert sorted(shelljit.compiles) == KERNELS and buildops.late_compiles() == []
    scale(torch.ones(3, 2))  # no pass listed 3 rows
    [late] = buildops.late_compiles()
    assert (late.library, late.kernel) == ("shelljit", "scale3") and "test_writing_a_backend.py" in late.where


def test_a_second_node_fetches_the_kernels_from_the_build_store(node, tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    monkeypatch.setenv("BUILDOPS_STORE", f"file://{tmp_path / 'store'}")
    for name, compiled, fetched in (("a", KERNELS, 0), ("b", [], 3)):
        cache = node(name)
        with build_pass("warmup"):
            scale(torch.ones(4, 2))
        assert sorted(shelljit.compiles) == compiled
        assert report().store.fetched == fetched
        assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == KERNELS


def test_a_manifest_prebuilds_the_kernels_on_a_machine_that_never_ran_the_pass(node, tmp_path):
    node("a")
    with build_pass("warmup"):
        scale(torch.ones(4, 2))
    manifest = save_manifest(tmp_path / "manifest.json")
    assert {e["library"] for e in load_manifest(manifest)} == {"shelljit"}
    cache = node("b")
    outcome = prebuild(manifest)
    assert (outcome.compiled, outcome.failed, outcome.refused) == (3, [], [])
    assert sorted(shelljit.compiles) == KERNELS and len(list(cache.iterdir())) == 3


def test_doctor_shows_the_backend(node):
    cache = node("a")
    found = json.loads(json.dumps(diagnose()))
    assert found["backends"]["shelljit"] == {"compiler": "sh"}
    assert found["caches"]["shelljit"]["path"] == str(cache)
    assert found["versions"]["shelljit"] == "installed (no __version__)"
