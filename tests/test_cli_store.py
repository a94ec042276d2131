"""The command line of the build store: `buildops store stats|ls|clear` against a directory and a real Redis,
`buildops prebuild` of a real manifest in fresh processes, and the store's line in a saved report."""

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from test_cli import clean_env, run

import buildops
from buildops import build_pass, report, settings
from buildops._config import redact_url
from buildops.manifests import save_manifest
from buildops.store import open_store
from buildops.store.packing import pack

from conftest import WAIT

KEYS = [hashlib.sha256(name).hexdigest() for name in (b"x", b"y")]


def filled(url):
    """The store at ``url`` with two real artifacts in it: {key: packed size}."""
    store = open_store(url)
    sizes = {}
    try:
        for i, key in enumerate(KEYS):
            blob = pack(key, {"kernel.cubin": b"k" * (100 * (i + 1)), "kernel.json": b"{}"})
            store.put(key, blob)
            sizes[key] = len(blob)
    finally:
        store.close()
    return sizes


@pytest.fixture(params=["file", "redis"])
def store_url(request, tmp_path, monkeypatch):
    """BUILDOPS_STORE set to a directory store, or to the real Redis of the test run."""
    (tmp_path / "store").mkdir()
    url = f"file://{tmp_path / 'store'}" if request.param == "file" else request.getfixturevalue("redis_url")
    monkeypatch.setenv("BUILDOPS_STORE", url)
    return url


def test_store_stats_ls_and_clear(store_url, capsys):
    sizes = filled(store_url)
    shown = redact_url(store_url)
    status, out, _ = run(capsys, "store", "stats", "--json")
    assert status == 0
    assert json.loads(out) == {"store": shown, "artifacts": 2, "bytes": sum(sizes.values()), "claims": 0}
    status, out, _ = run(capsys, "store", "stats")
    assert status == 0 and out.splitlines()[:2] == [f"store      {shown}", "artifacts  2"]

    status, out, _ = run(capsys, "store", "ls", "--json")
    assert status == 0 and json.loads(out) == [{"key": key, "bytes": sizes[key]} for key in sorted(KEYS)]
    status, out, _ = run(capsys, "store", "ls")
    assert [line.split() for line in out.splitlines()] == [[key, str(sizes[key])] for key in sorted(KEYS)]

    status, out, err = run(capsys, "store", "clear")
    assert (status, out) == (2, "") and "add --yes" in err and err.count("\n") == 1
    assert json.loads(run(capsys, "store", "stats", "--json")[1])["artifacts"] == 2  # nothing removed

    status, out, _ = run(capsys, "store", "clear", "--yes", "--json")
    assert status == 0 and json.loads(out) == {"store": shown, "removed": 2}
    assert run(capsys, "store", "ls") == (0, "", "")
    status, out, _ = run(capsys, "store", "clear", "--yes")
    assert (status, out) == (0, f"store {shown}: removed 0 artifact(s) and claim(s)\n")
    if store_url.startswith("redis"):
        assert store_url.split("@")[0].split(":")[-1] not in out  # the password


def test_store_without_a_store_configured_names_the_variable(monkeypatch, capsys):
    monkeypatch.delenv("BUILDOPS_STORE", raising=False)
    for action in ("stats", "ls"):
        status, out, err = run(capsys, "store", action)
        assert (status, out) == (2, "") and err.count("\n") == 1
        assert err.startswith("buildops: error: no build store configured: set BUILDOPS_STORE to redis://"), err
        assert "file:///" in err


def test_a_directory_store_that_does_not_exist_is_an_error_until_init_makes_it(monkeypatch, capsys, tmp_path):
    url = f"file://{tmp_path / 'st-typo'}"
    monkeypatch.setenv("BUILDOPS_STORE", url)
    for action in ("stats", "ls", "clear"):
        status, out, err = run(capsys, "store", action, "--yes")
        assert (status, out) == (1, "") and err.count("\n") == 1, err
        assert "does not exist" in err and "buildops store init" in err and "BUILDOPS_STORE" in err
    assert not (tmp_path / "st-typo").exists()  # a typo never becomes a store of its own

    status, out, _ = run(capsys, "store", "init")
    assert (status, out) == (0, f"store {url}: ready; empty (no build has stored an artifact there yet)\n")
    assert run(capsys, "store", "stats", "--json")[0] == 0


def test_store_with_a_bad_url_is_a_usage_error_without_its_password(monkeypatch, capsys):
    monkeypatch.setenv("BUILDOPS_STORE", "http://:hunter22@host/0")
    status, out, err = run(capsys, "store", "stats")
    assert (status, out) == (2, "") and "BUILDOPS_STORE" in err and "hunter22" not in err


def test_store_that_is_down_is_one_line_exit_1_without_its_password(monkeypatch, capsys, fresh_redis_server):
    url = fresh_redis_server.url
    fresh_redis_server.kill()
    monkeypatch.setenv("BUILDOPS_STORE", url)
    for action in ("stats", "ls"):
        status, out, err = run(capsys, "store", action)
        assert (status, out) == (1, "") and err.count("\n") == 1, err
        assert err.startswith(f"buildops: build store {redact_url(url)}: list failed: ConnectionError"), err
        assert fresh_redis_server.password not in err


def test_store_with_a_wrong_password_is_refused_without_it(monkeypatch, capsys, redis_server):
    monkeypatch.setenv("BUILDOPS_STORE", f"redis://:not-the-password-77@{redis_server.host}:{redis_server.port}/0")
    status, out, err = run(capsys, "store", "clear", "--yes")
    assert (status, out) == (1, "") and err.count("\n") == 1
    assert "not-the-password-77" not in err and redis_server.password not in err


# -- prebuild -------------------------------------------------------------------------------------------------------

bt = pytest.importorskip("buildops.backends.triton")
import triton_kernels as K  # noqa: E402


@pytest.fixture
def manifest(tmp_path, monkeypatch):
    """A manifest saved after a real pass over double_rows (3 distinct kernels), compiled in a cache of its own."""
    bt.target()  # without a GPU: the compile-only driver
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "pass-cache"))
    K.rows_kernel.device_caches.clear()
    with settings.scope(executor="threads"), build_pass("warmup"):
        K.double_rows(torch.zeros(40, 100))
    buildops.join(timeout=WAIT)
    path = save_manifest(tmp_path / "m.json")
    assert len(json.loads(path.read_text())["entries"]) == 3
    return path


def prebuild(path, tmp_path, name, **env):
    """``python -m buildops prebuild PATH --json`` in a fresh process with a fresh Triton cache: (status, JSON)."""
    env = clean_env(TRITON_CACHE_DIR=str(tmp_path / f"{name}-cache"),
                    BUILDOPS_NODE_LOCKS=str(tmp_path / f"{name}-locks"), **env)
    result = subprocess.run([sys.executable, "-m", "buildops", "prebuild", str(path), "--json"],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_prebuild_compiles_and_stores_then_another_machine_fetches(manifest, tmp_path, redis_url):
    status, first = prebuild(manifest, tmp_path, "first", BUILDOPS_STORE=redis_url)
    assert status == 0, first
    assert (first["compiled"], first["cached"], first["fetched"], first["failed"], first["refused"]) == (3, 0, 0, [],
                                                                                                         [])
    assert (first["store"]["store"], first["store"]["stored"], first["store"]["failed"]) == (redact_url(redis_url),
                                                                                             3, None)
    status, second = prebuild(manifest, tmp_path, "second", BUILDOPS_STORE=redis_url)
    assert status == 0, second
    assert (second["compiled"], second["fetched"], second["store"]["fetched"], second["store"]["stored"]) == (0, 3,
                                                                                                             3, 0)
    status, alone = prebuild(manifest, tmp_path, "alone")  # no store: compiled here, and no store counts
    assert (status, alone["compiled"], alone["store"]) == (0, 3, None)


@pytest.mark.parametrize("tamper", ["truncated cubin", "another arch"])
def test_a_fetched_artifact_this_node_must_not_load_is_bad_rebuilt_and_replaced(manifest, tmp_path, redis_url,
                                                                                 tamper):
    """An artifact whose recorded hashes match its files, but whose binary is not whole, or whose metadata names
    another target than its identity's: counted bad (not fetched), compiled here, and replaced in the store."""
    from buildops.store.packing import unpack

    status, _ = prebuild(manifest, tmp_path, "first", BUILDOPS_STORE=redis_url)
    assert status == 0
    store = open_store(redis_url)
    [key, *_] = sorted(k for k, _ in store.entries())
    files = dict(unpack(key, store.get(key)))
    for name, data in list(files.items()):
        if tamper == "truncated cubin" and name.endswith(".cubin"):
            files[name] = data[:len(data) // 2]
        elif tamper == "another arch" and name.endswith(".json") and "__grp__" not in name:
            metadata = json.loads(data)
            metadata["target"]["arch"] = 80
            files[name] = json.dumps(metadata).encode()
    store.put(key, pack(key, files))  # hashes of what it now holds: the store's own check passes

    status, second = prebuild(manifest, tmp_path, "second", BUILDOPS_STORE=redis_url)
    assert status == 0, second
    assert (second["fetched"], second["compiled"]) == (2, 1)
    assert (second["store"]["bad"], second["store"]["fetched"], second["store"]["stored"]) == (1, 2, 1)
    replaced = unpack(key, store.get(key))
    assert replaced != files and all(
        data[:4] == b"\x7fELF" for name, data in replaced.items() if name.endswith(".cubin"))
    store.close()


def test_prebuild_refuses_an_entry_whose_identity_was_edited(manifest, tmp_path, capsys):
    document = json.loads(manifest.read_text())
    document["entries"][0]["identity"] = "0" * 64
    label = document["entries"][0]["label"]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))

    status, out, _ = run(capsys, "prebuild", str(edited))
    assert status == 1
    [refused] = [line for line in out.splitlines() if line.startswith("refused: ")]
    assert refused.startswith(f"refused: {label}: made with another Triton install or settings ("), refused
    assert out.splitlines()[0] == (f"{edited}: 0 compiled, 2 cached, 0 fetched from the store, 0 failed, 1 refused, "
                                   "0 not prebuilt")  # the pass compiled the other two into this cache

    status, out, _ = run(capsys, "prebuild", "--json", str(edited))
    found = json.loads(out)
    assert status == 1 and [entry[0] for entry in found["refused"]] == [label] and found["store"] is None


def test_prebuild_refuses_to_build_a_kernel_whose_file_changed_since_the_manifest(manifest, tmp_path, capsys):
    document = json.loads(manifest.read_text())
    entry = document["entries"][0]
    here = K.rows_kernel.cache_key
    assert entry["cache_key"] == here  # the source hash of the kernel the pass listed
    entry["kernel"] = {"import": ["triton_kernels", "rows_kernel"]}  # as a kernel that travels by name
    entry["cache_key"] = "f" * 64  # saved where its file held other source
    edited = tmp_path / "changed.json"
    edited.write_text(json.dumps(document))

    status, out, _ = run(capsys, "prebuild", str(edited))
    assert status == 1
    [failed] = [line for line in out.splitlines() if line.startswith("failed: ")]
    assert "its file changed since" in failed and here[:16] in failed and "f" * 16 in failed, failed
    assert out.splitlines()[0].startswith(f"{edited}: 0 compiled, 2 cached, 0 fetched from the store, 1 failed")


@pytest.mark.parametrize("threads_env, threads", [("", 16), ("2", 2)])
def test_prebuild_builds_on_every_cpu_unless_buildops_threads_says(manifest, monkeypatch, capsys, threads_env,
                                                                   threads):
    """No engine starts beside a prebuild: by default its builder and pools have one build per CPU (16 here, where a
    pass keeps 4 of them for the engine: 12); a BUILDOPS_THREADS that is set is kept; after it, the default is back."""
    import buildops.cli
    import buildops.manifests
    from buildops._core.default import default_builder

    buildops.shutdown()  # the pass's builder: a prebuild's command starts with none
    monkeypatch.setattr(buildops.cli, "cpu_share", lambda: 16)
    monkeypatch.setenv("BUILDOPS_THREADS", threads_env)
    real, seen = buildops.manifests.prebuild, []

    def prebuild_seeing_threads(path):
        outcome = real(path)
        seen.append((settings.threads, default_builder().workers))  # a thread per queued build, up to the limit
        return outcome

    monkeypatch.setattr(buildops.manifests, "prebuild", prebuild_seeing_threads)
    before = settings.threads
    status, out, _ = run(capsys, "prebuild", "--json", str(manifest))
    assert status == 0 and json.loads(out)["cached"] == 3, out  # the pass compiled them into this cache
    assert seen == [(threads, min(threads, 3))] and settings.threads == before


def test_prebuild_of_a_file_that_is_not_a_manifest_is_exit_2(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text('{"format": "something-else"}')
    status, out, err = run(capsys, "prebuild", str(path))
    assert (status, out) == (2, "")
    assert err == f'buildops: error: {path}: not a buildops manifest (no "format": "buildops-manifest")\n'


# -- the store in a saved report ------------------------------------------------------------------------------------

def test_a_report_saved_with_store_counts_prints_the_store_line(tmp_path, monkeypatch, capsys):
    bt.target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "store").mkdir()
    monkeypatch.setenv("BUILDOPS_STORE", f"file://{tmp_path / 'store'}")
    K.rows_kernel.device_caches.clear()
    with settings.scope(executor="threads"), build_pass("warmup"):
        K.double_rows(torch.zeros(40, 100))
    buildops.join(timeout=WAIT)
    live = report()
    assert live.store is not None and (live.store.stored, live.store.failed) == (3, None)
    path = tmp_path / "report.json"
    live.save(path, manifest=True)

    status, out, _ = run(capsys, "report", str(path))
    assert status == 0 and out == live.format() + "\n"
    [line] = [line for line in out.splitlines() if line.startswith("store ")]
    assert line.startswith(f"store file://{tmp_path / 'store'}: 0 fetched (0.0 MB, 0.00 s), 3 stored (")
    assert line.endswith(" MB), 0 known locally, 0 waited for another node")

    data = json.loads(run(capsys, "report", "--json", str(path))[1])
    assert data["store"] == asdict(live.store)
    labels = [entry["label"] for entry in live.to_dict(manifest=True)["manifest"]]
    assert len(labels) == 3 and [entry["label"] for entry in data["manifest"]] == labels
    assert "manifest" not in live.to_dict()


def test_a_report_without_store_counts_loads_and_a_failed_store_says_so(tmp_path, capsys):
    saved = buildops.reporting.Report((), ()).to_dict()
    assert saved["store"] is None
    del saved["store"]  # a report saved before reports had the store's counts
    path = tmp_path / "old.json"
    path.write_text(json.dumps(saved))
    assert buildops.load_report(path)["store"] is None

    counts = buildops._core.sharing.StoreCounts(store="redis://:***@host:6379/0", fetched=12, fetched_bytes=3_400_000,
                                                fetch_seconds=0.21, stored=3, stored_bytes=800_000, known_locally=40,
                                                waited_for_others=2, failed="build store down")
    path = tmp_path / "new.json"
    buildops.reporting.Report((), (), store=counts).save(path)
    status, out, _ = run(capsys, "report", str(path))
    assert status == 0 and out.splitlines()[-1] == (
        "store redis://:***@host:6379/0: 12 fetched (3.4 MB, 0.21 s), 3 stored (0.8 MB), 40 known locally, "
        "2 waited for another node; turned off: build store down")
    broken = {**json.loads(path.read_text()), "store": {**asdict(counts), "stored": "three"}}
    path.write_text(json.dumps(broken))
    status, _, err = run(capsys, "report", str(path))
    assert status == 2 and "store: 'stored' is 'three', not a int" in err
