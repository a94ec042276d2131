"""A bad Triton cache entry (a truncated cubin, an empty or missing file) is rebuilt, never reported built."""

import os
import pathlib
import pickle

import pytest
import torch

from buildops import settings

import triton_kernels as K

bt = pytest.importorskip("buildops.backends.triton")
from triton.runtime.cache import FileCacheManager  # noqa: E402

from buildops.backends.triton import artifacts  # noqa: E402
from buildops.backends.triton.worker import workers as triton_workers  # noqa: E402


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """An empty Triton cache dir, and no kernel already in memory, for each test."""
    bt.target()  # without a GPU: the compile-only driver
    directory = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(directory))
    K.add_kernel.device_caches.clear()
    yield directory
    K.add_kernel.device_caches.clear()


def build(block=128):
    """Build one variant of ``add_kernel`` as a fresh process would (nothing in memory); its run."""
    K.add_kernel.device_caches.clear()
    x = torch.zeros(64)
    [one] = bt.triton_builds("add", K.add_kernel, x, x, x, 32, BLOCK=block)
    return one.run()


def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_truncated_cubin_is_rebuilt_and_the_build_counts_as_compiled(cache):
    assert build().cached is False
    [entry] = [p.parent for p in cache.glob("*/add_kernel.cubin")]
    whole = (entry / "add_kernel.cubin").read_bytes()
    (entry / "add_kernel.cubin").write_bytes(whole[:10])
    assert build().cached is False  # Triton alone takes the 10 bytes as a cache hit
    assert (entry / "add_kernel.cubin").read_bytes() == whole
    assert artifacts.entry_problem(str(entry), "add_kernel.json") is None
    assert build().cached is True  # a whole entry is still a hit


@pytest.mark.parametrize("damage", ["empty metadata", "missing cubin", "empty group file"])
def test_a_damaged_entry_is_rebuilt(cache, damage):
    build()
    [entry] = [p.parent for p in cache.glob("*/add_kernel.cubin")]
    before = snapshot(entry)
    if damage == "empty metadata":
        (entry / "add_kernel.json").write_text("")  # Triton alone fails the compile reading it
    elif damage == "missing cubin":
        (entry / "add_kernel.cubin").unlink()  # Triton alone fails the compile looking for it
    else:
        (entry / "__grp__add_kernel.json").write_text("")  # Triton 3.6 alone fails the compile reading it
    assert build().cached is False
    assert snapshot(entry).keys() == before.keys()
    assert (entry / "add_kernel.cubin").read_bytes() == before["add_kernel.cubin"]


def test_only_the_bad_entry_is_deleted(cache):
    build(128)
    build(256)
    entries = [p.parent for p in cache.glob("*/add_kernel.cubin")]
    assert len(entries) == 2
    (cache / "users-notes.txt").write_text("mine")
    bad = next(e for e in entries if "128" in (e / "add_kernel.source").read_text())
    good = next(e for e in entries if e != bad)
    kept = snapshot(good)
    mtimes = {p: p.stat().st_mtime_ns for p in good.iterdir()}
    (bad / "add_kernel.cubin").write_bytes(b"\x7fELF" + b"\0" * 6)
    (bad / "stale-extra-file").write_text("left by something else in the bad entry")
    assert build(128).cached is False
    assert snapshot(good) == kept and {p: p.stat().st_mtime_ns for p in good.iterdir()} == mtimes
    assert (cache / "users-notes.txt").read_text() == "mine"
    assert not (bad / "stale-extra-file").exists()  # the bad entry's directory went as a whole
    assert sorted(p.name for p in cache.iterdir() if ".bad-" in p.name) == []


def test_an_entry_a_compile_leaves_bad_is_built_once_more_then_fails_the_build(cache, monkeypatch):
    put = FileCacheManager.put
    writes = []

    def truncating_put(self, data, filename, binary=True):
        if filename.endswith(".cubin"):
            writes.append(filename)
            data = bytes(data)[:10]
        return put(self, data, filename, binary)

    monkeypatch.setattr(FileCacheManager, "put", truncating_put)
    with pytest.raises(artifacts.BadCacheEntry, match=r"kernel 'add_kernel' is bad again after a rebuild: "
                                                       r".*add_kernel\.cubin: not an ELF file \(10 bytes"):
        build()
    assert writes == ["add_kernel.cubin"] * 2  # built once more, not more
    assert list(cache.glob("*/add_kernel.cubin")) == []  # nothing bad left to load as a hit
    monkeypatch.setattr(FileCacheManager, "put", put)
    assert build().cached is False  # and a later build compiles


def test_one_bad_compile_then_a_good_one_is_built(cache, monkeypatch):
    put = FileCacheManager.put
    bad = [True]

    def truncate_once(self, data, filename, binary=True):
        if filename.endswith(".cubin") and bad:
            bad.pop()
            data = bytes(data)[:10]
        return put(self, data, filename, binary)

    monkeypatch.setattr(FileCacheManager, "put", truncate_once)
    assert build().cached is False
    [cubin] = cache.glob("*/add_kernel.cubin")
    assert artifacts.elf_problem(cubin.read_bytes()) is None


def test_a_worker_process_rebuilds_a_bad_entry(cache):
    build()
    [cubin] = cache.glob("*/add_kernel.cubin")
    whole = cubin.read_bytes()
    cubin.write_bytes(whole[:10])
    try:
        with settings.scope(executor="processes", threads=1):
            outcome = build()
    finally:
        triton_workers.stop_workers()
    assert outcome.cached is False and cubin.read_bytes() == whole


def test_entries_outside_builds_are_left_to_triton(cache):
    build()
    [cubin] = cache.glob("*/add_kernel.cubin")
    cubin.write_bytes(cubin.read_bytes()[:10])
    manager = FileCacheManager(cubin.parent.name)
    assert manager.get_group("add_kernel.json") is not None  # no check, no delete: buildops is not building
    assert cubin.exists()


def test_elf_problems():
    elf = pathlib.Path(os.path.realpath("/proc/self/exe")).read_bytes()  # a real ELF: this Python
    assert artifacts.elf_problem(elf) is None
    assert "not an ELF" in artifacts.elf_problem(b"\x7fELF\0\0")
    assert "not an ELF" in artifacts.elf_problem(b"MZ" + bytes(100))
    assert "header truncated" in artifacts.elf_problem(elf[:40])
    assert "past the file" in artifacts.elf_problem(elf[: len(elf) // 2])


def test_the_error_travels_from_a_worker_process():
    error = pickle.loads(pickle.dumps(artifacts.BadCacheEntry("k", "/c/E/k.cubin", "empty", again=True)))
    assert (error.kernel, error.path, error.problem, error.again) == ("k", "/c/E/k.cubin", "empty", True)
    assert str(error) == "Triton's cache entry of kernel 'k' is bad again after a rebuild: /c/E/k.cubin: empty"


@pytest.mark.gpu
def test_on_a_gpu_a_rebuilt_entry_loads_and_runs(cache):
    assert build().cached is False
    [cubin] = cache.glob("*/add_kernel.cubin")
    whole = cubin.read_bytes()
    cubin.write_bytes(whole[:10])  # Triton alone loads this as a hit; the GPU load then fails
    assert build().cached is False and cubin.read_bytes() == whole
    x = torch.arange(64, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    K.add_kernel[(1,)](x, x, out, 32, BLOCK=128)
    assert torch.equal(out[:32], 2 * x[:32])
