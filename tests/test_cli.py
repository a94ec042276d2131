"""The command line: `buildops report` of a saved report, `buildops doctor`, usage errors; and saved reports."""

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import buildops
from buildops import Build, BuildConfig, DynamicSpec, LateCompile, Outcome, build_pass, lists_kernels, report, settings
from buildops._config import declared, redact_url
from buildops.cli import main
from buildops.reporting import ListedNothing, OpReport, Report
from buildops.saved_reports import load_report
from buildops.store import open_store
from buildops.store.packing import pack

from conftest import WAIT

ROOT = Path(__file__).resolve().parents[1]
KEY = hashlib.sha256(b"x").hexdigest()


def run(capsys, *argv):
    """``main(argv)`` in this process: (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


class Says:
    """A run that says what the Build contract lets it say (compiled, found cached, skipped)."""

    def __init__(self, cached=None, skipped=None):
        self.cached, self.skipped = cached, skipped

    def __call__(self):
        return Outcome(cached=self.cached, skipped=self.skipped)


def fails():
    raise RuntimeError("compiler crashed")


@pytest.fixture
def real_report():
    """A report of real builds: two ops in a pass, one of them with a failed build, one op that listed nothing,
    and builds that compiled, found their kernel cached and were skipped."""
    runs = [Says(cached=False), Says(cached=True), Says(skipped="interpreter mode"), fails]

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1, 4])), output="x", name="gemm")
    def gemm(x):
        return x

    gemm.lister(lambda x: [Build("gemm", ("gemm", x.shape[0], i), run, library="lib") for i, run in enumerate(runs)])

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1, 4])), output="x", name="silent")
    def silent(x):
        return x

    silent.lister(lambda x: [])
    with build_pass("warmup"):
        gemm(torch.zeros(4, 2))
        silent(torch.zeros(4, 2))
    buildops.join(timeout=WAIT)
    return report()


# -- saved reports ------------------------------------------------------------------------------------------------

def test_a_saved_report_prints_the_table_of_the_live_one(real_report, tmp_path, capsys):
    text = real_report.format()
    assert "failed: gemm: " in text and "RuntimeError: compiler crashed" in text
    assert "lib: 4 kernel(s) prebuilt (2 compiled, 2 found cached), 0 compiled late" in text
    assert "lib: 2 build(s) skipped: interpreter mode" in text
    assert "op silent listed nothing in pass 'warmup' for 1 call signature(s)" in text
    path = tmp_path / "report.json"
    real_report.save(path)

    status, out, err = run(capsys, "report", str(path))
    assert (status, err) == (0, "")
    assert out == text + "\n"
    assert out.splitlines()[2].split()[:7] == ["gemm", "8", "0", "6", "2", "0", "0"]


def test_a_saved_report_as_json_is_the_reports_dict(real_report, tmp_path, capsys):
    path = tmp_path / "report.json"
    real_report.save(path)
    status, out, _ = run(capsys, "report", "--json", str(path))
    data = json.loads(out)
    assert status == 0 and data == real_report.to_dict() == load_report(path)
    assert (data["format"], data["version"], data["buildops"]) == ("buildops-report", 1, buildops.__version__)
    [gemm] = data["ops"]  # an op that listed nothing has no row: it is in listed_nothing
    assert (gemm["op"], gemm["listed"], gemm["built"], gemm["failed"]) == ("gemm", 8, 6, 2)
    assert isinstance(gemm["build_seconds"], float)
    assert data["totals"]["failed"] == 2 and data["totals"]["built"] == 6
    assert [f["op"] for f in data["failures"]] == ["gemm", "gemm"]
    assert data["coverage"] == {"lib": {"prebuilt": 4, "late": 0, "compiled": 2, "cached": 2, "unknown": 0,
                                        "skipped": {"interpreter mode": 2}, "elsewhere": {}}}
    assert data["listed_nothing"] == [{"op": "silent", "pass_name": "warmup", "signatures": 1}]


def test_late_compiles_and_coverage_round_trip():
    late = LateCompile("triton", "kernels.add", "n=7", ("add",), "model.py:12")
    rep = Report((OpReport("add", 3, 1, 2, 0, 0, 0, 0.5, 0.25),), (), {"triton": 2}, (late,), (),
                 (ListedNothing("norm", "warmup", 2),))
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["late"] == [{"library": "triton", "kernel": "kernels.add", "variant": "n=7", "ops": ["add"],
                             "where": "model.py:12", "kind": "compile"}]
    assert data["coverage"]["triton"]["late"] == 1
    assert buildops.reporting.format_report(data) == rep.format()
    assert late.describe() in rep.format()


def test_tunings_are_counted_apart_from_compiles_before_and_after_ready(tmp_path):
    from buildops._core.build import BuildRecord, BuildState

    def tuning(name, ended):
        return BuildRecord(Build("mm", name, lambda: None, serial=True), BuildState.BUILT, 1.0, 0.0, ended - 1.0,
                           None)

    compile_ = BuildRecord(Build("mm", "compile", lambda: None, library="lib"), BuildState.BUILT, 1.0, 0.0, 0.0, None)
    builds = (compile_, tuning("a", 5.0), tuning("b", 9.0), tuning("c", 11.0))
    rep = Report((), (), {"lib": 1}, builds=builds, ready=10.0)
    assert rep.tunings() == {"built": 3, "before_ready": 2, "after_ready": 1}
    assert "tunings: 3 built, 2 before ready and 1 after it (behind serving)" in rep.format()
    assert Report((), (), builds=builds).tunings() == {"built": 3, "before_ready": None, "after_ready": None}
    assert "tunings: 3 built\n" in Report((), (), builds=builds).format() + "\n"
    assert "tunings" not in Report((), ()).format()
    path = tmp_path / "report.json"
    rep.save(path)
    assert load_report(path)["tunings"] == rep.tunings()
    saved = json.loads(path.read_text())
    del saved["tunings"]  # a report saved before tunings were counted
    path.write_text(json.dumps(saved))
    assert load_report(path)["tunings"] is None


def test_what_the_sweeps_covered_round_trips_and_old_reports_load_without_it(tmp_path):
    from buildops._core.coverage import BeyondMax, Swept

    rep = Report((), (), swept=(Swept("mm", "x.0", 1, 4096, 13), Swept("mm", "w.1", 64, 64, 1)),
                 beyond_max=(BeyondMax("mm", {"x.0": 5000}, {"x.0": 4096}),))
    path = tmp_path / "report.json"
    rep.save(path)
    loaded = load_report(path)
    assert buildops.reporting.format_report(loaded) == rep.format()
    assert "swept mm: x.0 1..4096 (13 values), w.1 64" in rep.format()
    saved = json.loads(path.read_text())
    del saved["swept"], saved["beyond_max"]  # a report saved before they were kept
    path.write_text(json.dumps(saved))
    assert (load_report(path)["swept"], load_report(path)["beyond_max"]) == ([], [])


def test_save_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("an older report")
    Report((), ()).save(path)
    assert os.listdir(tmp_path) == ["report.json"]
    assert load_report(path)["ops"] == []


def test_a_file_that_is_not_a_report_is_one_line_and_exit_2(tmp_path, capsys):
    cases = {
        "text.json": ("not json at all", "not a buildops report: not JSON"),
        "other.json": ('{"format": "something-else"}', 'not a buildops report (no "format": "buildops-report")'),
        "future.json": ('{"format": "buildops-report", "version": 2}', "a buildops report of version 2; this "
                        "buildops reads version 1"),
    }
    broken = Report((OpReport("add", 3, 1, 2, 0, 0, 0, 0.5, 0.25),), ()).to_dict()
    broken["ops"][0]["listed"] = "three"
    cases["broken.json"] = (json.dumps(broken), "ops[0]: 'listed' is 'three', not a int")
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        status, out, err = run(capsys, "report", str(path))
        assert (status, out) == (2, "")
        assert err.count("\n") == 1 and err.startswith(f"buildops: error: {path}: {message}"), err
        with pytest.raises(ValueError, match=str(path)):
            load_report(path)
    missing = tmp_path / "missing.json"
    status, _, err = run(capsys, "report", str(missing))
    assert status == 2 and err == f"buildops: error: cannot read {missing}: No such file or directory\n"


# -- usage ----------------------------------------------------------------------------------------------------------

def test_bad_usage_is_one_line_and_exit_2(capsys):
    for argv, message in (((), "the following arguments are required: COMMAND (see buildops --help)"),
                          (("nope",), "argument COMMAND: invalid choice: 'nope'"),
                          (("report",), "the following arguments are required: FILE.json (see buildops report "
                                        "--help)"),
                          (("doctor", "--jsn"), "unrecognized arguments: --jsn")):
        status, out, err = run(capsys, *argv)
        assert (status, out) == (2, "") and err.count("\n") == 1, (argv, err)
        assert err.startswith("buildops: error: ") and message in err, (argv, err)


def test_version_and_help(capsys):
    assert run(capsys, "--version") == (0, f"buildops {buildops.__version__}\n", "")
    status, out, _ = run(capsys, "--help")
    assert status == 0 and "doctor" in out and "report" in out


# -- doctor ---------------------------------------------------------------------------------------------------------

def clean_env(**variables):
    """This process's environment without any BUILDOPS_* variable, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDOPS")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **variables}


@pytest.mark.parametrize("command", [["report", "report.json"], ["report", "report.json", "--json"],
                                     ["doctor", "--json"]], ids=["report", "report-json", "doctor-json"])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path, command):
    Report((OpReport("add", 3, 1, 2, 0, 0, 0, 0.5, 0.25),), ()).save(tmp_path / "report.json")
    env = clean_env(BUILDOPS_NODE_LOCKS=str(tmp_path / "locks"), DG_JIT_CACHE_DIR=str(tmp_path / "dg"))
    reader, writer = os.pipe()
    os.close(reader)  # `| head -0`: gone before the command writes a line
    try:
        done = subprocess.run([sys.executable, "-m", "buildops", *command], stdout=writer, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=env, cwd=tmp_path)
    finally:
        os.close(writer)
    assert done.stderr == "" and done.returncode == 141  # as a command SIGPIPE ended: no traceback


def test_python_m_buildops_doctor_json(tmp_path):
    locks = tmp_path / "locks"
    env = clean_env(BUILDOPS_THREADS="3", BUILDOPS_NODE_LOCKS=str(locks), DG_JIT_CACHE_DIR=str(tmp_path / "dg"))
    result = subprocess.run([sys.executable, "-m", "buildops", "doctor", "--json"], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["versions"]["python"] == platform.python_version()
    assert found["versions"]["buildops"] == buildops.__version__
    assert found["versions"]["torch"] == torch.__version__
    assert set(found["versions"]) == {"python", "buildops", "torch", "triton", "flashinfer", "deep_gemm", "redis"}
    assert found["cuda"]["available"] == torch.cuda.is_available()
    assert set(found["settings"]) == set(declared())
    assert found["settings"]["threads"] == {"env": "BUILDOPS_THREADS", "source": "env", "value": 3}
    assert found["settings"]["late_compile"] == {"env": "BUILDOPS_LATE_COMPILE", "source": "default",
                                                 "value": "warn"}
    assert found["caches"]["node_locks"] == {"path": str(locks), "exists": False, "writable": True}
    assert found["caches"]["deep_gemm"]["path"] == str(tmp_path / "dg")
    assert found["store"] == {"configured": False} and found["problems"] == []


def test_doctor_names_a_bad_setting_and_exits_1(monkeypatch, capsys):
    monkeypatch.setenv("BUILDOPS_THREADS", "abc")
    error = "BUILDOPS_THREADS='abc': expected a whole number >= 1"
    status, out, _ = run(capsys, "doctor")
    assert status == 1
    [line] = [line for line in out.splitlines() if line.strip().startswith("BUILDOPS_THREADS ")]
    assert line.split() == ["BUILDOPS_THREADS", "error:", *error.split(), "env"]
    assert out.splitlines()[-2:] == ["problems (1):", f"  {error}"]

    status, out, _ = run(capsys, "doctor", "--json")
    found = json.loads(out)
    assert status == 1 and found["problems"] == [error]
    assert found["settings"]["threads"] == {"env": "BUILDOPS_THREADS", "source": "env", "error": error}


def test_doctor_says_where_each_setting_came_from(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("BUILDOPS_WORKER_NICE", "5")
    with settings.scope(late_compile="error"):
        status, out, _ = run(capsys, "doctor", "--json")
    found = json.loads(out)["settings"]
    assert status == 0
    assert (found["late_compile"]["source"], found["late_compile"]["value"]) == ("scope", "error")
    assert (found["worker_nice"]["source"], found["worker_nice"]["value"]) == ("env", 5)
    assert (found["build_timeout"]["source"], found["build_timeout"]["value"]) == ("default", 900.0)
    assert found["node_locks"]["source"] == "env"  # the test fixture's own directory

    status, out, _ = run(capsys, "doctor")
    [line] = [line for line in out.splitlines() if "BUILDOPS_WORKER_NICE" in line]
    assert line.split() == ["BUILDOPS_WORKER_NICE", "5", "env"]


def test_doctor_reports_the_triton_target_and_the_caches(monkeypatch, capsys, tmp_path):
    pytest.importorskip("triton")
    from triton import knobs

    dg = tmp_path / "dg"
    dg.mkdir()
    (dg / "kernel.so").write_bytes(b"x" * 10)
    (dg / "sub").mkdir()
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(dg))
    monkeypatch.setenv("BUILDOPS_TRITON_TARGET", "cuda:80")
    status, out, _ = run(capsys, "doctor", "--json")
    found = json.loads(out)
    assert status == 0
    assert found["caches"]["deep_gemm"] == {"path": str(dg), "exists": True, "writable": True, "entries": 2,
                                            "top_level_bytes": 10}
    assert found["caches"]["triton"]["path"] == knobs.cache.dir
    if not torch.cuda.is_available():  # a machine without a GPU: builds compile for the setting's target
        # in a fresh process: this one may have compiled already, which fixes its target (then doctor says that)
        fresh = subprocess.run([sys.executable, "-m", "buildops", "doctor", "--json"], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        assert json.loads(fresh.stdout)["backends"]["triton"] == {
            "target": "cuda:80 (compile-only: no GPU driver, from BUILDOPS_TRITON_TARGET)"}
    text = run(capsys, "doctor")[1]
    assert f"deep_gemm   {dg}" in text and "writable, 2 entries, 10 bytes in top-level files" in text

    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", "off")
    found = json.loads(run(capsys, "doctor", "--json")[1])
    assert found["caches"]["node_locks"] == {"path": None, "note": "off (BUILDOPS_NODE_LOCKS)"}


# -- the store, and its password ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
    ("redis://user:s3cret@host:6379/0", "redis://user:***@host:6379/0"),
    ("rediss://user:p#a/s@w@host/0", "rediss://user:***@host/0"),  # characters a URL parser would split at
    ("redis://host:6379/0?password=s3cret&db=1", "redis://host:6379/0?password=***&db=1"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("file:///srv/store", "file:///srv/store"),
])
def test_store_urls_never_show_a_password(url, shown):
    assert redact_url(url) == shown


def doctor_store(capsys):
    """``buildops doctor`` and ``doctor --json``: (exit status, text, the JSON's store part and problems)."""
    status, text, _ = run(capsys, "doctor")
    json_status, out, _ = run(capsys, "doctor", "--json")
    found = json.loads(out)
    assert json_status == status
    return status, text + out, found["store"], found["problems"]


def test_doctor_reports_a_file_store_that_answers(monkeypatch, capsys, tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}", create=True)
    store.put(KEY, pack(KEY, {"kernel.cubin": b"x" * 100}))
    monkeypatch.setenv("BUILDOPS_STORE", store.url)
    status, text, found, problems = doctor_store(capsys)
    size = len(pack(KEY, {"kernel.cubin": b"x" * 100}))
    assert (status, problems) == (0, [])
    assert found == {"configured": True, "url": store.url, "reachable": True,
                     "stats": {"store": store.url, "artifacts": 1, "bytes": size, "claims": 0}}
    assert f"store: {store.url}: reachable; 1 artifact(s), 0.0 MB" in text


def test_doctor_says_a_store_is_empty_and_that_a_missing_directory_is_a_problem(monkeypatch, capsys, tmp_path):
    (tmp_path / "store").mkdir()
    monkeypatch.setenv("BUILDOPS_STORE", f"file://{tmp_path / 'store'}")
    status, text, _, problems = doctor_store(capsys)
    assert (status, problems) == (0, [])
    assert "reachable; empty (no build has stored an artifact there yet)" in text

    monkeypatch.setenv("BUILDOPS_STORE", f"file://{tmp_path / 'st-typo'}")
    status, text, found, problems = doctor_store(capsys)
    assert status == 1 and found["reachable"] is False
    assert problems == [f"store file://{tmp_path / 'st-typo'}: {found['error']}"]
    assert "does not exist" in found["error"] and "buildops store init" in found["error"]
    assert not (tmp_path / "st-typo").exists()


def test_doctor_reports_a_redis_store_that_answers_without_its_password(monkeypatch, capsys, redis_url,
                                                                        redis_server):
    monkeypatch.setenv("BUILDOPS_STORE", redis_url)
    status, text, found, problems = doctor_store(capsys)
    shown = redact_url(redis_url)
    assert (status, problems) == (0, [])
    assert found == {"configured": True, "url": shown, "reachable": True,
                     "stats": {"store": shown, "artifacts": 0, "bytes": 0, "claims": 0}}
    assert f"store: {shown}: reachable; " in text and redis_server.password not in text


def test_doctor_reports_a_redis_store_that_is_down_without_its_password(monkeypatch, capsys, fresh_redis_server):
    url = fresh_redis_server.url
    fresh_redis_server.kill()
    monkeypatch.setenv("BUILDOPS_STORE", url)
    status, text, found, problems = doctor_store(capsys)
    assert status == 1 and fresh_redis_server.password not in text
    assert (found["url"], found["reachable"]) == (redact_url(url), False)
    assert "ConnectionError" in found["error"], found["error"]
    assert problems == [f"store {redact_url(url)}: {found['error']}"]
    assert f"store: {redact_url(url)}: not reachable: " in text


def test_doctor_reports_a_wrong_redis_password_without_it(monkeypatch, capsys, redis_server):
    url = f"redis://:not-the-password-77@{redis_server.host}:{redis_server.port}/0"
    monkeypatch.setenv("BUILDOPS_STORE", url)
    status, text, found, _ = doctor_store(capsys)
    assert status == 1 and "not-the-password-77" not in text and redis_server.password not in text
    assert (found["url"], found["reachable"]) == (redact_url(url), False)
    assert "AuthenticationError" in found["error"] or "WRONGPASS" in found["error"], found["error"]


def test_doctor_reports_a_store_module_that_cannot_be_imported(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "buildops.store", None)  # an import of it fails
    monkeypatch.setenv("BUILDOPS_STORE", "redis://:hunter22@host/0")
    status, out, _ = run(capsys, "doctor", "--json")
    store = json.loads(out)["store"]
    assert status == 1 and store["reachable"] is False and store["error"].startswith("ModuleNotFoundError: ")
    monkeypatch.delenv("BUILDOPS_STORE")
    assert json.loads(run(capsys, "doctor", "--json")[1])["store"] == {"configured": False}
