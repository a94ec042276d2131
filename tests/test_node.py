"""Builds shared by the processes of one node: each key built once, however many processes need it."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from buildops import BuildState
from buildops._core.builder import Builder

from conftest import WAIT

TESTS = Path(__file__).resolve().parent


def test_a_key_another_builder_holds_waits_while_other_keys_build(runs):
    gate = threading.Event()
    first, second = Builder(threads=1), Builder(threads=1)  # two claimants, as two processes would be
    try:
        held = first.submit(runs.build("op", "shared", gate=gate))
        assert runs.started.wait(WAIT)
        shared = second.submit(runs.build("op", "shared"))
        other = second.submit(runs.build("op", "other"))
        assert other.result(WAIT) == "other"  # built while "shared" was claimed elsewhere
        time.sleep(0.2)
        assert not shared.done() and second.state("shared") is BuildState.QUEUED
        gate.set()
        assert held.result(WAIT) == "shared" and shared.result(WAIT) == "shared"
        assert runs.calls == ["shared", "other", "shared"]  # the second "shared" only after the first finished
    finally:
        first.shutdown()
        second.shutdown()


def start_ranks(count, tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "BUILDOPS_NODE_LOCKS": str(tmp_path / "locks"),
           "BUILDOPS_THREADS": "1", "BUILDOPS_EXECUTOR": "threads",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    return [subprocess.Popen([sys.executable, str(TESTS / "node_child.py")], env=env, stdout=subprocess.PIPE,
                             text=True) for _ in range(count)]


def summary(process):
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out
    return json.loads(out.splitlines()[-1])


def test_three_processes_compile_each_kernel_once(tmp_path):
    ranks = [summary(p) for p in start_ranks(3, tmp_path)]
    variants = 12
    assert sum(r["compiled"] for r in ranks) == variants  # the node compiled each variant once ...
    assert all(r["compiled"] >= 1 for r in ranks)  # ... the processes splitting the work between them ...
    assert all(r["compiled"] + r["loaded"] == variants for r in ranks)  # ... and every process has every one
    assert all(r["after"] == 0 and r["built"] == variants and r["failed"] == 0 for r in ranks)


def test_a_process_that_dies_mid_build_hangs_nobody(tmp_path):
    victim, *others = start_ranks(3, tmp_path)
    assert victim.stdout.readline().strip() == "started"
    time.sleep(1.0)  # let it claim and start building
    victim.send_signal(signal.SIGKILL)
    victim.wait(WAIT)
    ranks = [summary(p) for p in others]
    assert all(r["built"] == 12 and r["failed"] == 0 and r["after"] == 0 for r in ranks)


def test_an_unusable_lock_directory_leaves_builds_unshared_not_lost(runs, tmp_path, monkeypatch, caplog):
    import buildops
    from buildops._core.default import default_builder

    locks = tmp_path / "locks"
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    builder = default_builder()  # makes the directory
    locks.rmdir()
    locks.write_text("")  # now a file: no lock file can be made in it
    with caplog.at_level("WARNING", logger="buildops"):
        assert builder.submit(runs.build("op", "first")).result(WAIT) == "first"
        assert builder.submit(runs.build("op", "second")).result(WAIT) == "second"
    assert buildops.join(timeout=WAIT)
    warnings = [r.getMessage() for r in caplog.records if "BUILDOPS_NODE_LOCKS" in r.getMessage()]
    assert len(warnings) == 1 and str(locks) in warnings[0]  # once, naming the variable and the directory


def test_a_lock_directory_that_cannot_be_made_leaves_builds_unshared(runs, tmp_path, monkeypatch, caplog):
    from buildops._core.default import default_builder

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / "a-file" / "locks"))
    with caplog.at_level("WARNING", logger="buildops"):
        assert default_builder().submit(runs.build("op", "key")).result(WAIT) == "key"
    assert any("BUILDOPS_NODE_LOCKS" in r.getMessage() for r in caplog.records)


def test_a_build_a_serving_call_waits_for_stays_first_while_another_process_builds_it(runs):
    from conftest import Runs, until

    elsewhere = Runs()
    held, blocker = threading.Event(), threading.Event()
    first, second = Builder(threads=1), Builder(threads=1)  # two claimants, as two processes would be
    try:
        first.submit(elsewhere.build("op", "shared", gate=held))
        assert elsewhere.started.wait(WAIT)
        second.submit(runs.build("op", "blocker", gate=blocker))
        assert runs.started.wait(WAIT)
        second.submit(runs.build("op", "no one waits for it"))
        shared = second.submit(runs.build("op", "shared"))
        assert second.expedite([shared]) == 1
        blocker.set()
        record = second._records["shared"]
        assert until(lambda: record.refused_since is not None)  # claimed elsewhere: put back, still urgent
        held.set()
        assert shared.result(WAIT) == "shared" and second.join(timeout=WAIT)
        assert runs.calls == ["blocker", "shared", "no one waits for it"]
    finally:
        held.set()
        blocker.set()
        first.shutdown()
        second.shutdown()
