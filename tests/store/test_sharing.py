"""Builds shared through a real store (Redis on loopback, or a directory) by builders that stand for nodes: each
has its own library cache; the store is the only thing they share."""

import logging
import os
import signal
import threading
import time

import pytest

from buildops import settings
from buildops._core.builder import Builder
from buildops.store import open_store
from buildops.store.packing import pack

from artifacts_for_tests import FileArtifact, Node
from conftest import WAIT, until


@pytest.fixture(params=["redis", "file"])
def store_url(request, tmp_path):
    (tmp_path / "store").mkdir()
    return request.getfixturevalue("redis_url") if request.param == "redis" else f"file://{tmp_path / 'store'}"


def node_builder(url, threads=2, **settings_overrides):
    with settings.scope(store=url, **settings_overrides):
        return Builder(threads=threads)


def build_all(builder, builds):
    futures = [builder.submit(b) for b in builds]
    assert builder.join(timeout=WAIT)
    for future in futures:
        future.result()
    return {r.build.label: r for r in builder.history()}


def test_a_second_node_fetches_what_the_first_built(store_url, tmp_path):
    first, second = Node(tmp_path / "a"), Node(tmp_path / "b")
    names = [f"k{i}" for i in range(5)]
    builder = node_builder(store_url)
    build_all(builder, [first.build(n) for n in names])
    assert sorted(first.compiles) == names
    assert builder.store_counts().stored == 5
    builder.shutdown()

    builder = node_builder(store_url)
    records = build_all(builder, [second.build(n) for n in names])
    assert second.compiles == [] and all(records[n].origin == "store" for n in names)
    counts = builder.store_counts()
    assert (counts.fetched, counts.stored) == (5, 0) and counts.fetched_bytes > 0
    assert (tmp_path / "b" / "k0").read_bytes() == (tmp_path / "a" / "k0").read_bytes()
    builder.shutdown()

    builder = node_builder(store_url)  # a restart of the second node: its cache has them, the store is not asked
    build_all(builder, [second.build(n) for n in names])
    assert builder.store_counts().known_locally == 5 and builder.store_counts().fetched == 0
    builder.shutdown()


def test_a_store_that_is_down_leaves_builds_local_and_warns_once(fresh_redis_server, tmp_path, caplog):
    url = fresh_redis_server.url
    fresh_redis_server.kill()
    node = Node(tmp_path / "a")
    builder = node_builder(url, store_timeout=0.5)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="buildops"):
        build_all(builder, [node.build(f"k{i}") for i in range(6)])
    assert time.monotonic() - start < 0.5 * 3 + 2, "the store's failure cost more than its timeout"
    assert sorted(node.compiles) == [f"k{i}" for i in range(6)]
    warnings = [r for r in caplog.records if "without the store" in r.getMessage()]
    assert len(warnings) == 1 and fresh_redis_server.password not in warnings[0].getMessage()
    assert builder.store_counts().failed is not None
    builder.shutdown()


def test_a_bad_artifact_in_the_store_is_rebuilt_and_replaced(store_url, tmp_path, caplog):
    node = Node(tmp_path / "a")
    build = node.build("k")
    identity = build.artifact.identity()
    good = pack(identity, {"k": b"compiled k" * 100})
    store = open_store(store_url)
    store.put(identity, good[:-7])  # a partial upload
    builder = node_builder(store_url)
    with caplog.at_level(logging.WARNING, logger="buildops"):
        build_all(builder, [build])
    assert node.compiles == ["k"] and any("is bad" in r.getMessage() for r in caplog.records)
    assert builder.store_counts().bad == 1
    assert store.get(identity) == good, "the rebuilt artifact replaced the bad one"
    builder.shutdown()


def test_a_build_another_node_holds_waits_for_its_artifact(store_url, tmp_path):
    node = Node(tmp_path / "b")
    build = node.build("k")
    identity = build.artifact.identity()
    store = open_store(store_url)
    held = store.claim(identity, lease=30)  # another node builds it
    builder = node_builder(store_url)
    future = builder.submit(build)
    time.sleep(0.5)
    assert not future.done() and node.compiles == []
    other = Node(tmp_path / "a")
    other.build("k").run()
    store.put(identity, pack(identity, FileArtifact("k", tmp_path / "a").collect()))
    held.release()
    future.result(timeout=WAIT)
    assert node.compiles == [] and builder.store_counts().waited_for_others == 1
    assert builder.history()[0].origin == "store"
    builder.shutdown()


def test_a_claim_whose_holder_died_is_built_once_its_lease_lapses(store_url, tmp_path):
    node = Node(tmp_path / "b")
    build = node.build("k")
    assert open_store(store_url).claim(build.artifact.identity(), lease=1.0) is not None  # never renewed
    builder = node_builder(store_url)
    start = time.monotonic()
    build_all(builder, [build])
    assert node.compiles == ["k"] and 0.8 < time.monotonic() - start < WAIT
    builder.shutdown()


def test_a_node_that_waited_past_the_build_timeout_builds_it_itself(store_url, tmp_path, caplog):
    node = Node(tmp_path / "b")
    build = node.build("k")
    assert open_store(store_url).claim(build.artifact.identity(), lease=60) is not None  # alive, but stuck
    builder = node_builder(store_url)
    with settings.scope(build_timeout=1), caplog.at_level(logging.WARNING, logger="buildops"):
        build_all(builder, [build])
    assert node.compiles == ["k"] and builder.store_counts().built_after_others == 1
    assert any("BUILDOPS_BUILD_TIMEOUT" in r.getMessage() for r in caplog.records)
    builder.shutdown()


def test_a_lease_is_renewed_while_a_long_build_runs(store_url, tmp_path):
    node = Node(tmp_path / "a")
    builder = node_builder(store_url, store_lease=0.6)
    build = node.build("slow", seconds=2.0)
    future = builder.submit(build)
    time.sleep(1.5)  # past the lease: renewed, so no other node can claim it
    assert open_store(store_url).claim(build.artifact.identity(), lease=30) is None
    future.result(timeout=WAIT)
    builder.shutdown()


def test_a_store_that_stops_answering_while_claims_are_held_costs_one_timeout(fresh_redis_server, tmp_path,
                                                                              caplog):
    node = Node(tmp_path / "a")
    gate = threading.Event()
    builder = node_builder(fresh_redis_server.url, threads=3, store_timeout=0.5)
    held = [builder.submit(node.build(f"held{i}", gate=gate)) for i in range(2)]  # claimed, building
    assert until(lambda: builder.busy == 2)
    os.kill(fresh_redis_server.process.pid, signal.SIGSTOP)  # the store stops answering
    try:
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="buildops"):
            builder.submit(node.build("late")).result(timeout=WAIT)
            gate.set()
            for future in held:
                future.result(timeout=WAIT)
            builder.shutdown()
        assert time.monotonic() - start < 0.5 * 2 + 1, "more than one request went to the stopped store"
        assert [r for r in caplog.records if "without the store" in r.getMessage()]
        assert sorted(node.compiles) == ["held0", "held1", "late"]
    finally:
        os.kill(fresh_redis_server.process.pid, signal.SIGCONT)


def test_a_claim_file_that_is_not_a_token_does_not_stop_the_builder(tmp_path):
    node = Node(tmp_path / "a")
    gate = threading.Event()
    (tmp_path / "store").mkdir()
    url = f"file://{tmp_path / 'store'}"
    builder = node_builder(url)
    first = builder.submit(node.build("k", gate=gate))
    claims = tmp_path / "store" / "claims"
    assert until(lambda: claims.is_dir() and any(not p.name.startswith(".") for p in claims.iterdir()))
    for claim in claims.iterdir():
        claim.write_bytes(b"\xff\xfe not a token")  # another tool wrote over it
    gate.set()
    first.result(timeout=WAIT)
    build_all(builder, [node.build("next")])  # the worker lived on
    assert sorted(node.compiles) == ["k", "next"]
    builder.shutdown()


def test_a_build_stored_by_another_node_just_before_the_claim_is_fetched_not_built(store_url, tmp_path):
    node, other = Node(tmp_path / "b"), Node(tmp_path / "a")
    build = node.build("k")
    identity = build.artifact.identity()
    store = open_store(store_url)
    other.build("k").run()
    stored = pack(identity, FileArtifact("k", tmp_path / "a").collect())

    class StoredMeanwhile:  # the other node stores it and lets go between this node's look and its claim
        def __getattr__(self, name):
            return getattr(store, name)

        def claim(self, key, lease):
            store.put(key, stored)
            return store.claim(key, lease)

    builder = node_builder(store_url)
    builder._sharing._store = StoredMeanwhile()
    build_all(builder, [build])
    assert node.compiles == [] and builder.history()[0].origin == "store"
    assert store.claims() == 0, "the claim taken before the second look was not released"
    builder.shutdown()
