"""The node-lock directory against another local account: planted links, a directory others can write or own,
lock files others could open. The tests run as root here; "another user" is uid 65534 (nobody)."""

import os
import stat
import tempfile
from pathlib import Path

import pytest

import buildops
from buildops._core.default import default_builder
from buildops._runtime.gpu import _NodeHolders
from buildops._runtime.node import NodeClaims, node_claims

WAIT = 10.0
NOBODY = 65534
FIX = "BUILDOPS_NODE_LOCKS=<a directory you own, mode 0700>, or off"


def build(key):
    return buildops.Build("op", key, lambda: key)


def built(keys):
    builder = default_builder()
    results = [builder.submit(build(key)).result(WAIT) for key in keys]
    assert buildops.join(timeout=WAIT)
    return results


def lock_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "BUILDOPS_NODE_LOCKS" in r.getMessage()]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)  # the usual umask, under which files default to 0644 and directories to 0755
    yield
    os.umask(old)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("the victim's data\n")
    path.chmod(0o644)
    return path


def unchanged(victim):
    found = victim.stat()
    return victim.read_text() == "the victim's data\n" and stat.S_IMODE(found.st_mode) == 0o644


def test_a_planted_link_at_a_lock_name_leaves_its_target_untouched(tmp_path, monkeypatch, victim, caplog):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    NodeClaims(locks).path("planted").symlink_to(victim)
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["planted", "other"]) == ["planted", "other"]  # the build goes on, unshared
    assert unchanged(victim)  # neither emptied nor made 0600 through the link
    assert (locks / NodeClaims(locks).path("other").name).is_file()  # other keys are still claimed


def test_a_world_writable_directory_is_refused_and_builds_go_on(tmp_path, monkeypatch, caplog):
    locks = tmp_path / "locks"
    locks.mkdir()
    locks.chmod(0o777)  # as another user would leave it, for anyone to plant or delete lock files in
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["a", "b"]) == ["a", "b"]
        assert node_claims() is None
    assert list(locks.iterdir()) == []  # node sharing is off: no lock file was made there
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(locks) in warnings[0] and "mode 0777" in warnings[0] and FIX in warnings[0]


def test_the_default_directory_planted_by_another_user_is_refused(tmp_path, monkeypatch, victim, caplog):
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a directory another user (nobody) owns")
    monkeypatch.delenv("BUILDOPS_NODE_LOCKS")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"buildops-node-locks-{os.getuid()}"  # the predictable name, made first by another user
    planted.mkdir()
    planted.chmod(0o777)
    NodeClaims(planted).path("key").symlink_to(victim)
    os.chown(planted, NOBODY, NOBODY)
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["key"]) == ["key"]
    assert unchanged(victim)
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and str(planted) in warnings[0] and f"uid {NOBODY}" in warnings[0], warnings


def test_a_directory_another_user_owns_is_refused(tmp_path, monkeypatch, caplog):
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a directory another user (nobody) owns")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    os.chown(locks, NOBODY, NOBODY)  # not writable by others, but its owner may replace the lock files
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["a"]) == ["a"]
    assert list(locks.iterdir()) == []
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and f"owned by uid {NOBODY} with mode 0700" in warnings[0] and FIX in warnings[0]


def test_a_directory_that_is_a_link_is_refused(tmp_path, monkeypatch, caplog):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "locks").symlink_to(real)
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / "locks"))
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["a"]) == ["a"]
    assert list(real.iterdir()) == []
    warnings = lock_warnings(caplog)
    assert len(warnings) == 1 and "symbolic link" in warnings[0]


def test_the_directory_is_made_0700_and_its_lock_files_0600(tmp_path, monkeypatch, umask_022):
    locks = tmp_path / "new" / "locks"
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    assert built(["a", "b"]) == ["a", "b"]
    assert stat.S_IMODE(locks.stat().st_mode) == 0o700
    made = sorted(locks.iterdir())
    assert len(made) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in made), made


def test_a_lock_file_an_older_version_left_readable_is_made_0600(tmp_path, monkeypatch, umask_022):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    old = NodeClaims(locks).path("a")
    old.write_text("")
    old.chmod(0o644)  # anyone could open it and flock it, stalling this key's build
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(locks))
    assert built(["a"]) == ["a"]
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="POSIX only")
def test_the_memory_gate_lock_files_are_0600_and_never_follow_a_link(tmp_path, umask_022, victim):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    gate = _NodeHolders(locks, "GPU-0")
    assert gate.admitting.acquire()
    gate.admitting.release()
    _NodeHolders.let_go(gate.hold())
    made = sorted(locks.iterdir())
    assert len(made) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in made), made

    planted = _NodeHolders(locks, "GPU-1")
    (locks / "gpu-GPU-1.holders.lock").symlink_to(victim)
    with pytest.raises(OSError):  # the gate counts this process's builds only (MemoryGate._lose_node)
        planted.hold()
    assert unchanged(victim)
    assert Path(locks / "gpu-GPU-1.holders.lock").is_symlink()


def test_the_default_directory_an_older_version_left_0755_is_made_0700(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("BUILDOPS_NODE_LOCKS")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = tmp_path / f"buildops-node-locks-{os.getuid()}"
    mine.mkdir()
    mine.chmod(0o755)  # this user's, as an older buildops made it: anyone could read its lock files' names
    with caplog.at_level("WARNING", logger="buildops"):
        assert built(["a"]) == ["a"]
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and len(list(mine.iterdir())) == 1
    assert lock_warnings(caplog) == []
