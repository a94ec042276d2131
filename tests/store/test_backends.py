"""The build store's backends against real ones: a directory and a redis-server on loopback (the fixtures start
it). The same contract for both: whole values, exclusive claims with leases, keys that name nothing else."""

import hashlib
import json
import struct
import subprocess
import sys
import threading
import time

import pytest

from buildops.store import StoreError, open_store
from buildops.store.packing import MAGIC, BadArtifact, pack, unpack

from conftest import WAIT, until


def key(name):
    return hashlib.sha256(name.encode()).hexdigest()


@pytest.fixture(params=["file", "redis"])
def store(request, tmp_path):
    (tmp_path / "store").mkdir()
    url = f"file://{tmp_path / 'store'}" if request.param == "file" else request.getfixturevalue("redis_url")
    opened = open_store(url, timeout=2.0)
    yield opened
    opened.close()


def test_a_value_put_is_got_whole_and_listed(store):
    blob = pack(key("a"), {"entry/kernel.cubin": b"\x7fELF" + bytes(1000), "entry/__grp__k.json": b"{}"})
    assert store.get(key("a")) is None
    store.put(key("a"), blob)
    assert store.get(key("a")) == blob
    assert unpack(key("a"), store.get(key("a")))["entry/kernel.cubin"].startswith(b"\x7fELF")
    assert dict(store.entries()) == {key("a"): len(blob)}
    assert store.stats() == {"store": store.where, "artifacts": 1, "bytes": len(blob), "claims": 0}


def test_clear_removes_artifacts_and_claims(store):
    store.put(key("a"), b"x")
    held = store.claim(key("b"), lease=30)
    assert held is not None and store.claims() == 1
    assert store.clear() == 2
    assert store.get(key("a")) is None and store.claims() == 0 and list(store.entries()) == []


def test_a_claim_is_exclusive_until_released(store):
    first = store.claim(key("k"), lease=30)
    assert first is not None
    assert store.claim(key("k"), lease=30) is None
    first.release()
    again = store.claim(key("k"), lease=30)
    assert again is not None
    again.release()


def test_an_unrenewed_lease_lapses_and_a_renewed_one_does_not(store):
    kept = store.claim(key("kept"), lease=0.6)
    lapsing = store.claim(key("lapsing"), lease=0.6)
    assert kept is not None and lapsing is not None
    for _ in range(4):
        time.sleep(0.25)
        assert kept.renew()
    assert store.claim(key("kept"), lease=30) is None
    taken = store.claim(key("lapsing"), lease=30)
    assert taken is not None, "a lease not renewed for its length lapses"
    assert not lapsing.renew(), "a lapsed lease is not renewed over another node's claim"
    lapsing.release()  # must not release the claim the other node holds now
    assert store.claim(key("lapsing"), lease=30) is None


def claimed_at_once(store, name, claimers=8):
    """The leases ``claimers`` threads, released together, got on one key."""
    won = []
    start = threading.Barrier(claimers)

    def claim():
        start.wait(WAIT)
        lease = store.claim(key(name), lease=30)
        if lease is not None:
            won.append(lease)

    threads = [threading.Thread(target=claim) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    return won


def test_threads_claiming_one_key_at_once_get_one_lease(store):
    assert len(claimed_at_once(store, "contended")) == 1


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "*", "k" * 64, ""])
def test_keys_that_are_not_identities_are_refused(store, bad):
    with pytest.raises(ValueError, match="not a build store key"):
        store.get(bad)
    with pytest.raises(ValueError, match="not a build store key"):
        store.put(bad, b"x")


def test_unpack_refuses_anything_not_whole_and_intact():
    blob = pack(key("a"), {"e/one": b"1" * 100, "e/two": b"2" * 50})
    assert unpack(key("a"), blob) == {"e/one": b"1" * 100, "e/two": b"2" * 50}
    with pytest.raises(BadArtifact, match="truncated"):
        unpack(key("a"), blob[:-10])
    flipped = bytearray(blob)
    flipped[-60] ^= 0xFF
    with pytest.raises(BadArtifact, match="sha256"):
        unpack(key("a"), bytes(flipped))
    with pytest.raises(BadArtifact, match="after the last file"):
        unpack(key("a"), blob + b"extra")
    with pytest.raises(BadArtifact, match="holds key " + key("a")[:16]):
        unpack(key("b"), blob)  # stored under another key
    with pytest.raises(BadArtifact, match="magic"):
        unpack(key("a"), b"PK\x03\x04 a zip file")
    for path in ("../up", "/abs", "a/../b", "a//b", "./a"):
        with pytest.raises(ValueError, match="plain relative path"):
            pack(key("a"), {path: b""})


def test_unpack_refuses_a_crafted_path_in_the_header():
    header = json.dumps({"key": key("a"), "files": [["../../etc/cron.d/x", 1, hashlib.sha256(b"x").hexdigest()]]})
    blob = MAGIC + struct.pack(">Q", len(header)) + header.encode() + b"x"
    with pytest.raises(BadArtifact, match="plain relative path"):
        unpack(key("a"), blob)


def test_a_wrong_password_fails_with_a_store_error_that_hides_it(redis_server):
    url = f"redis://:not-{redis_server.password}@127.0.0.1:{redis_server.port}/0"
    store = open_store(url, timeout=2.0)
    with pytest.raises(StoreError) as raised:
        store.get(key("a"))
    assert f"not-{redis_server.password}" not in str(raised.value) and "***" in str(raised.value)


def test_a_killed_server_fails_requests_within_the_timeout(fresh_redis_server):
    store = open_store(fresh_redis_server.url, timeout=0.5)
    store.put(key("a"), b"x" * 1000)
    fresh_redis_server.kill()
    start = time.monotonic()
    with pytest.raises(StoreError):
        store.put(key("b"), b"y" * (4 << 20))  # an upload when the server is gone
    with pytest.raises(StoreError):
        store.claim(key("c"), lease=30)
    assert time.monotonic() - start < 3 * 0.5 + 1


def test_a_full_server_refuses_a_put_with_a_store_error(fresh_redis_server):
    fresh_redis_server.config_set("maxmemory-policy", "noeviction")
    fresh_redis_server.config_set("maxmemory", str(8 << 20))
    store = open_store(fresh_redis_server.url, timeout=2.0)
    stored = []
    with pytest.raises(StoreError, match="OOM|memory"):
        for index in range(16):
            store.put(key(str(index)), bytes([index]) * (1 << 20))
            stored.append(index)
    assert stored, "the server took no value at all: maxmemory too low for the test"
    assert all(store.get(key(str(index))) == bytes([index]) * (1 << 20) for index in stored)  # still whole


@pytest.mark.parametrize("cut", ["connection", "server"])
def test_an_upload_cut_off_midway_fails_and_leaves_no_part_of_it(fresh_redis_server, cut):
    store = open_store(fresh_redis_server.url, timeout=2.0)
    blob, failed = bytes(256 << 20), []

    def upload():
        try:
            store.put(key("big"), blob)
        except StoreError as error:
            failed.append(error)

    with fresh_redis_server.client() as watcher:
        uploading = threading.Thread(target=upload)
        uploading.start()

        me = watcher.client_id()

        def uploaders():  # mid-upload: the server holds part of the command in another client's query buffer
            return [c for c in watcher.client_list() if int(c.get("qbuf", 0)) > 0 and int(c["id"]) != me]

        assert until(uploaders), "no upload seen"
        if cut == "server":
            fresh_redis_server.kill()
        else:
            watcher.client_kill_filter(_id=uploaders()[0]["id"])
        uploading.join(WAIT)
        assert failed, "the cut-off upload did not fail"
        if cut == "connection":  # the server is up: it kept nothing of the value
            assert watcher.get("buildops:artifact:" + key("big")) is None


def test_two_processes_claiming_one_key_get_one_lease(redis_url, tmp_path):
    go = tmp_path / "go"
    claim = (f"import os, sys, time\nfrom buildops.store import open_store\nstore = open_store({redis_url!r})\n"
             f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
             f"print('won' if store.claim({key('contended')!r}, 30) else 'lost')\n")
    children = [subprocess.Popen([sys.executable, "-c", claim], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(1.0)  # every child has imported and waits
    go.touch()
    outcomes = sorted(child.communicate(timeout=WAIT)[0].strip() for child in children)
    assert outcomes == ["lost", "lost", "lost", "won"]


def test_a_lapsed_claim_is_taken_over_by_one_claimer(store):
    # Rounds: a takeover that leaves the key without a claim for a moment let 2 of 8 claimers win in 4% of them.
    for round_ in range(30):
        name = f"lapsing-{round_}"
        assert store.claim(key(name), lease=0.05) is not None
        time.sleep(0.1)
        assert len(claimed_at_once(store, name)) == 1, f"round {round_}"


def test_a_lapsed_lease_is_not_renewed_and_its_release_leaves_the_key_claimable(store):
    """A lapsed claim may be being taken over at that moment: renewing or unlinking it then could undo the
    takeover, so it is neither renewed nor removed, and the next claim takes it over."""
    old = store.claim(key("lapsed"), lease=0.05)
    time.sleep(0.1)
    assert old is not None and old.renew() is False
    old.release()
    assert store.claim(key("lapsed"), lease=30) is not None


def test_claims_taken_over_and_never_released_leave_no_files_behind(tmp_path):
    """A directory store's takeover marks go with their claims: those of holders that never released (they died,
    or their renewal failed) are removed by the next takeover, and never refuse it."""
    store = open_store(f"file://{tmp_path}", timeout=5)
    for round_ in range(20):
        assert store.claim(key("abandoned"), lease=0.01) is not None, f"round {round_}"
        time.sleep(0.02)
    marks = [p.name for p in (tmp_path / "claims").iterdir() if ".taking." in p.name]
    assert len(marks) <= 1, marks


def test_a_lease_taken_over_is_not_renewed_and_its_release_spares_the_new_claim(store):
    old = store.claim(key("k"), lease=0.2)
    time.sleep(0.4)
    new = store.claim(key("k"), lease=30)
    assert old is not None and new is not None
    assert old.renew() is False
    old.release()
    assert store.claim(key("k"), lease=30) is None, "the old lease's release removed the new claim"
