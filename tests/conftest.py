import ast
import contextlib
import os
import select
import shutil
import signal
import threading
import time

import pytest
import torch

from buildops import Build, BuildConfig, DynamicSpec, lists_kernels

WAIT = 10.0  # every wait in the tests has a timeout, so a bug fails instead of hanging


def waiting_on(builder):
    """An event set each time ``builder.wait`` begins: ``wait_for`` calls it once it has expedited its builds."""
    began = threading.Event()
    wait = builder.wait

    def waits(*args, **kwargs):
        began.set()
        return wait(*args, **kwargs)

    builder.wait = waits
    return began


def in_a_child_forked_while_held(hold, probe, then_in_parent=lambda: None):
    """What ``probe()`` returns (a literal: bools, numbers, strings, tuples of them) in a child forked while another
    thread is inside ``hold()``, a context manager; that thread holds on until the child has answered and
    ``then_in_parent()`` has run."""
    held, release = threading.Event(), threading.Event()

    def holder_body():
        with hold():
            held.set()
            release.wait(WAIT)

    holder = threading.Thread(target=holder_body)
    holder.start()
    try:
        assert held.wait(WAIT)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, repr(probe()).encode())
            finally:
                os._exit(0)
        os.close(write)
        if not select.select([read], [], [], WAIT)[0]:  # the child hangs (a lock still held there): fail, not hang
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child gave no answer in {WAIT} s")
        answer = os.read(read, 4096).decode()
        os.waitpid(pid, 0)
        then_in_parent()
        return ast.literal_eval(answer)
    finally:
        release.set()
        holder.join(WAIT)


@contextlib.contextmanager
def holding(*locks):
    """Every one of ``locks`` acquired, in order, within the block."""
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


def until(reached, timeout=WAIT):
    """Wait until ``reached()`` is true (a state another thread gets to, not a time); False if it never is."""
    deadline = time.monotonic() + timeout
    while not reached():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.005)
    return True


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh(fresh_buildops, tmp_path, monkeypatch):  # fresh_buildops: from buildops' pytest plugin
    # each test its own node-lock dir: tests reuse build keys, and other test runs on the machine may too
    monkeypatch.setenv("BUILDOPS_NODE_LOCKS", str(tmp_path / "node-locks"))
    yield


class Runs:
    """Makes builds that record each run and can be held on a gate (a threading.Event)."""

    def __init__(self):
        self.calls = []
        self._lock = threading.Lock()
        self.started = threading.Event()

    def build(self, op, key, *, gate=None, fail=False, uses_gpu=False, loads_only=False, serial=False, seconds=0.0):
        def run():
            with self._lock:
                self.calls.append(key)
            self.started.set()
            if gate is not None:
                assert gate.wait(WAIT), f"gate of build {key!r} was never opened"
            if seconds:
                threading.Event().wait(seconds)
            if fail:
                raise RuntimeError(f"compiler crashed on {key!r}")
            return key
        return Build(op, key, run, uses_gpu=uses_gpu, loads_only=loads_only, serial=serial)

    def count(self, key=None):
        with self._lock:
            return len(self.calls) if key is None else self.calls.count(key)


def op_listing(runs, name="op", **build_kwargs):
    """An op with one build per call signature: key (name, x.shape[1]); dim 0 is swept "exact"."""
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name=name)
    def op(x):
        return x

    op.lister(lambda x: [runs.build(name, (name, x.shape[1]), **build_kwargs)])
    return op


@pytest.fixture
def runs():
    return Runs()


def _needs_redis_server():
    reason = "needs redis-server on PATH: the Debian package redis-server (scripts/redis installs it)"
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):  # CI installs it: a skip there would hide a broken install step
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server for the whole run; tests that kill or reconfigure a server take ``fresh_redis_server``."""
    _needs_redis_server()
    from redis_server import RedisServer  # imported here: a venv without the store extra still runs the other tests

    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_url(redis_server):
    """The shared server's URL, its data flushed before the test."""
    with redis_server.client() as client:
        client.flushall()
    yield redis_server.url


@pytest.fixture
def fresh_redis_server(tmp_path):
    """A redis-server of the test's own, stopped after it."""
    _needs_redis_server()
    from redis_server import RedisServer

    with RedisServer(tmp_path / "redis") as server:
        yield server
