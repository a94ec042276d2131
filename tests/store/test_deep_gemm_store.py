"""DeepGEMM's cache entries shared through a real store, against the fake DeepGEMM (which keeps a cache laid out
as DeepGEMM's: ``DG_JIT_CACHE_DIR/cache/kernel.<name>.<hash>/``). Two nodes, one after the other, each its own
DeepGEMM cache; the second compiles nothing."""

import json

import pytest
import torch

from buildops import settings
from buildops._core.builder import Builder
from buildops.backends.deep_gemm import GemmShape, deep_gemm_builds
from buildops.testing import reset

import fake_deep_gemm
from conftest import WAIT

SHAPES = [GemmShape("dense", 256, 128), GemmShape("masked", 128, 256, 2)]


@pytest.fixture(params=["redis", "file"])
def store_url(request, tmp_path):
    (tmp_path / "store").mkdir()
    return request.getfixturevalue("redis_url") if request.param == "redis" else f"file://{tmp_path / 'store'}"


def node(url, cache, log, monkeypatch, executor, shapes=SHAPES, threads=2, max_tokens=8):
    """One node's pass over the shapes (each a build of its GEMM and one of its scales' copy); the fake's calls
    it made, and its builder."""
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("FAKE_DEEP_GEMM_LOG", str(log))
    with settings.scope(store=url, executor=executor):
        builder = Builder(threads=threads)
        futures = [builder.submit(b) for b in deep_gemm_builds(shapes, max_tokens, mode="full",
                                                                module="fake_deep_gemm", device="cpu")]
        for future in futures:
            future.result(timeout=WAIT * 6)
    builder.shutdown()
    reset()  # worker processes keep the environment they started with: the next node starts its own
    return [json.loads(line) for line in (log.read_text() if log.exists() else "").splitlines()], builder


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_second_node_runs_deep_gemm_without_compiling(store_url, tmp_path, monkeypatch, executor):
    first, first_builder = node(store_url, tmp_path / "a", tmp_path / "a.jsonl", monkeypatch, executor)
    assert first and any(call["compiled"] for call in first)  # Ms that share a kernel compile it once
    assert first_builder.store_counts().stored == 2 + 2
    second, second_builder = node(store_url, tmp_path / "b", tmp_path / "b.jsonl", monkeypatch, executor)
    assert not any(call["compiled"] for call in second)  # every kernel was there
    # the GEMMs' builds run their Ms again (which kernels they need is not predicted here); the scales' copies,
    # whose kernel is known, find it installed and run nothing
    assert len(second) == len(first) - 2
    assert not any(c["fn"] == "get_mn_major_tma_aligned_tensor" for c in second)
    assert second_builder.store_counts().fetched == 2 + 2
    assert sorted(p.name for p in (tmp_path / "b" / "cache").iterdir()) == \
        sorted(p.name for p in (tmp_path / "a" / "cache").iterdir())
    assert not list((tmp_path / "b" / "tmp").glob("buildops-*")), "an install left its staging directory"


def test_an_artifact_that_lacked_an_entry_is_completed_by_the_next_node_that_fetches_it(store_url, tmp_path,
                                                                                     monkeypatch):
    """A build's artifact is the entries that appeared while it ran: on the first node, one of the shape's kernels
    was in the cache already (a serving call compiled it before any pass), so its artifact lacks it. A node that
    fetches the artifact compiles that kernel, and stores the artifact again with it: the next node compiles
    nothing."""
    shapes = [GemmShape("dense", 256, 384)]  # Ms 1-300 of it pick several tilings, so several kernels
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "a"))
    fp8 = torch.float8_e4m3fn
    fake_deep_gemm.fp8_gemm_nt((torch.zeros(300, 384).to(fp8), torch.ones(300, 3)),
                               (torch.zeros(256, 384).to(fp8), torch.ones(2, 3)),
                               torch.empty(300, 256, dtype=torch.bfloat16))  # M = 300's kernel, and the copy's
    _, first = node(store_url, tmp_path / "a", tmp_path / "a.jsonl", monkeypatch, "threads", shapes, threads=1,
                    max_tokens=300)
    # the GEMM's build, without M = 300's kernel; the copy's, with its kernel found in the cache: its own
    assert first.store_counts().stored == 2
    compiled = []
    for name in ("b", "c"):
        calls, builder = node(store_url, tmp_path / name, tmp_path / f"{name}.jsonl", monkeypatch, "threads",
                              shapes, threads=1, max_tokens=300)  # one at a time: its new entries are its own
        compiled.append(sorted({entry.split(".")[1] for call in calls for entry in call["compiled"]}))
        assert builder.store_counts().fetched == 2
        assert builder.store_counts().stored == (1 if name == "b" else 0)
    assert compiled == [["sm90_fp8_gemm_1d2d"], []]


def test_a_node_stores_what_it_compiled_and_not_what_it_fetched_though_its_builds_overlap(store_url, tmp_path,
                                                                                       monkeypatch):
    """A DeepGEMM build takes the entries that appeared while it ran: on a node that fetches, those are also other
    builds' installs and compiles. They are no compile of its own, and must not send its artifact back to the
    store."""
    shapes = [GemmShape("dense", 256, 128 * k) for k in range(1, 7)]
    _, first = node(store_url, tmp_path / "a", tmp_path / "a.jsonl", monkeypatch, "threads", shapes, threads=1)
    assert first.store_counts().stored == 2 * len(shapes)
    monkeypatch.setenv("FAKE_DEEP_GEMM_GIL_SECONDS", "0.02")  # runs long enough to overlap the others'
    more = shapes + [GemmShape("dense", 384, 128 * k) for k in (7, 8)]
    counts = []
    for name in ("b", "c"):
        calls, builder = node(store_url, tmp_path / name, tmp_path / f"{name}.jsonl", monkeypatch, "threads", more,
                              threads=4)
        counts.append((builder.store_counts().fetched, builder.store_counts().stored))
        assert name == "b" or not any(call["compiled"] for call in calls)
    assert counts == [(2 * len(shapes), 2 + 2), (2 * len(more), 0)]  # GEMMs and the scales' copies


def test_a_second_node_fetches_each_predicted_kernel_alone_and_runs_nothing(store_url, tmp_path, monkeypatch):
    """Where DeepGEMM's choice of kernel is predicted, a build's artifact is its own kernel's entry, read from the
    code DeepGEMM generated (not the entries of the builds beside it); a node that fetches it finds the kernel
    there and starts no worker."""
    from buildops.backends.deep_gemm import builds, workers

    monkeypatch.setattr(builds, "device_arch", lambda device: "sm_90")  # the fake stands for DeepGEMM on an SM90
    shapes = [GemmShape("dense", 256, 384), GemmShape("masked", 256, 384, 2)]
    first, first_builder = node(store_url, tmp_path / "a", tmp_path / "a.jsonl", monkeypatch, "processes", shapes,
                                threads=2, max_tokens=300)
    made = {e.name for e in (tmp_path / "a" / "cache").iterdir()}
    assert first_builder.store_counts().stored == len(first) == len(made)  # a run, an entry and an artifact each
    assert first_builder.store_counts().stored_bytes < 2 * sum(
        f.stat().st_size for e in (tmp_path / "a" / "cache").iterdir() for f in e.iterdir())
    second, second_builder = node(store_url, tmp_path / "b", tmp_path / "b.jsonl", monkeypatch, "processes", shapes,
                                  threads=2, max_tokens=300)
    assert second == [] and second_builder.store_counts().fetched == len(made)
    assert {e.name for e in (tmp_path / "b" / "cache").iterdir()} == made and not workers.pool.started
