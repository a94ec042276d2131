"""A build store behind a slow link (issue 33, item 3): each request to it is bounded by BUILDOPS_STORE_TIMEOUT as a
whole, not per read. Redis behind a link passing 1 KiB/s once took ~25 s per fetch with a 2 s timeout, and the
store was never turned off; a 512 MiB artifact was read whole into memory (peak 816 MiB)."""

import hashlib
import logging
import os
import socket
import threading
import time
import tracemalloc

import pytest

from buildops import settings
from buildops._core.builder import Builder
from buildops.store import StoreError, open_store

from artifacts_for_tests import FileArtifact, Node
from conftest import WAIT

RATE = 1024  # bytes a second, each way


class SlowLink:
    """A TCP proxy on loopback in front of ``port`` that passes ``RATE`` bytes a second each way."""

    def __init__(self, port):
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pass, args=(source, sink), daemon=True).start()

    def _pass(self, source, sink):
        try:
            while data := source.recv(64):
                sink.sendall(data)
                time.sleep(len(data) / RATE)
        except OSError:
            pass

    def close(self):
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def slow_link(redis_server):
    link = SlowLink(redis_server.port)
    yield link
    link.close()


def test_a_fetch_over_a_slow_link_ends_at_the_store_timeout(redis_url, redis_server, slow_link):
    key = hashlib.sha256(b"big").hexdigest()
    fast = open_store(redis_url)  # the artifact stored over loopback: 200 KB, 200 s through the link
    fast.put(key, b"x" * 200_000)
    fast.close()
    slow = open_store(redis_url.replace(f":{redis_server.port}/", f":{slow_link.port}/"), timeout=1.0)
    outcome = {}

    def fetch():
        start = time.monotonic()
        try:
            slow.get(key)
        except StoreError as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the fetch outlasted its timeout tenfold"
    assert outcome["seconds"] < 3.0
    assert "BUILDOPS_STORE_TIMEOUT" in str(outcome["error"])
    slow.close()


def test_a_node_behind_a_slow_link_builds_locally_and_leaves_the_store_alone(redis_url, redis_server, slow_link,
                                                                              tmp_path, caplog):
    slow_url = redis_url.replace(f":{redis_server.port}/", f":{slow_link.port}/")
    node = Node(tmp_path / "a")
    with settings.scope(store=slow_url, store_timeout=1.0):
        builder = Builder(threads=2)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="buildops"):
        futures = [builder.submit(node.build(f"k{i}")) for i in range(4)]
        assert builder.join(timeout=WAIT)
    assert time.monotonic() - start < 1.0 * 3 + 2, "the slow store cost more than its timeout"
    assert all(f.exception() is None for f in futures) and sorted(node.compiles) == [f"k{i}" for i in range(4)]
    assert builder.store_counts().failed is not None and "BUILDOPS_STORE_TIMEOUT" in builder.store_counts().failed
    assert len([r for r in caplog.records if "without the store" in r.getMessage()]) == 1
    builder.shutdown()


def test_an_artifact_over_the_size_cap_is_built_here_unread_and_kept_local(redis_url, tmp_path, caplog):
    """BUILDOPS_STORE_MAX_MB: an artifact larger than it is neither read whole into memory nor stored."""
    import logging

    from buildops.store import TooLarge

    first = Node(tmp_path / "a")
    with settings.scope(store=redis_url):
        builder = Builder(threads=1)
    builder.submit(first.build("k0"))
    assert builder.join(timeout=WAIT)
    builder.shutdown()
    store = open_store(redis_url)
    [(key, size)] = list(store.entries())
    with pytest.raises(TooLarge):
        store.get(key, limit=size - 1)
    assert store.get(key, limit=size) is not None

    second = Node(tmp_path / "b")
    with settings.scope(store=redis_url, store_max_mb=1):
        builder = Builder(threads=1)
    assert builder._sharing.max_bytes == 2**20  # the setting, in bytes
    builder._sharing.max_bytes = size - 1  # below this small artifact's size: the setting counts whole MiB
    with caplog.at_level(logging.WARNING, logger="buildops"):
        builder.submit(second.build("k0"))
        assert builder.join(timeout=WAIT)
    assert second.compiles == ["k0"] and builder.store_counts().fetched == 0
    assert "over BUILDOPS_STORE_MAX_MB" in caplog.text
    builder.shutdown()
    store.close()


def test_a_directory_store_that_hangs_is_bounded_by_the_store_timeout(tmp_path):
    """A share whose server is gone blocks a read forever; a FIFO in the store's place blocks its open the same
    way. The request ends at BUILDOPS_STORE_TIMEOUT with the StoreError that turns the store off."""
    store = open_store(f"file://{tmp_path}", timeout=0.5, create=True)
    key = hashlib.sha256(b"hung").hexdigest()
    os.mkfifo(tmp_path / "artifacts" / key)
    outcome = {}

    def fetch():
        try:
            store.get(key)
        except StoreError as error:
            outcome["error"] = error

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "a hung directory store held its reader past the test's wait"
    assert "BUILDOPS_STORE_TIMEOUT" in str(outcome["error"])
    with open(tmp_path / "artifacts" / key, "wb"):  # lets the request's own thread go
        pass


@pytest.mark.parametrize("kind", ["file", "redis"])
def test_a_large_artifact_is_fetched_a_chunk_at_a_time(kind, tmp_path, request):
    """Two files of 24 MiB: the fetch's peak memory stays near the largest file the install asks for, not the
    whole blob and a copy of it."""
    from buildops.store.packing import pack

    url = f"file://{tmp_path / 'store'}" if kind == "file" else request.getfixturevalue("redis_url")
    store = open_store(url, create=True) if kind == "file" else open_store(url)
    artifact = FileArtifact("big", tmp_path / "a")
    half = 24 << 20
    files = {"big": os.urandom(1 << 20) * 24, "big.debug": os.urandom(1 << 20) * 24}
    store.put(artifact.identity(), pack(artifact.identity(), files))
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    del files
    store.close()

    node = Node(tmp_path / "b")
    with settings.scope(store=url, store_timeout=30.0):
        builder = Builder(threads=1)
    tracemalloc.start()
    try:
        builder.submit(node.build("big"))
        assert builder.join(timeout=WAIT * 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    builder.shutdown()
    assert node.compiles == [] and builder.store_counts().fetched == 1
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in node.cache.iterdir()} == expected
    assert peak < 1.5 * half, f"the fetch peaked at {peak / 2**20:.0f} MiB for a 48 MiB artifact"
