"""The runtime layer's own mechanisms: patches, the after-fork registry, hooks; and the core's extension registry."""

import contextlib
import os
import subprocess
import sys
import threading
import types

import pytest

from buildops._core import extensions
from buildops._core.state import core
from buildops._runtime import children, forking, gil, patching
from buildops._runtime.hooks import Hooks
from buildops._runtime.state import runtime

from conftest import WAIT, holding, in_a_child_forked_while_held


def _owner():
    return types.SimpleNamespace(fn=lambda x: x + 1)


def test_a_patch_is_applied_between_the_first_acquire_and_the_last_release():
    owner = _owner()
    original = owner.fn
    patch = patching.Patch(owner, "fn", lambda fn: lambda x: fn(x) * 10, "test")
    with patch.applied():
        assert owner.fn(1) == 20 and patch in patching.applied()
        with patch.applied():
            assert owner.fn(1) == 20
        assert owner.fn(1) == 20  # still held by the outer block
    assert owner.fn is original and patch not in patching.applied()
    with pytest.raises(RuntimeError, match="released more often than acquired"):
        patch.release()


def test_a_patch_restores_the_attribute_even_when_the_block_raises():
    owner = _owner()
    original = owner.fn
    patch = patching.Patch(owner, "fn", lambda fn: None, "test")
    with pytest.raises(ValueError), patch.applied():
        raise ValueError
    assert owner.fn is original


def test_threads_holding_one_patch_at_once_leave_it_as_it_was():
    owner = _owner()
    original = owner.fn
    patch = patching.Patch(owner, "fn", lambda fn: lambda x: -x, "test")
    start = threading.Barrier(8)

    def hold():
        start.wait(WAIT)
        for _ in range(200):
            with patch.applied():
                assert owner.fn(3) == -3
    threads = [threading.Thread(target=hold) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert owner.fn is original and not patch.active


IMPORT_EVERYTHING = r"""
import buildops, buildops.capture, buildops.reporting, buildops.startup, buildops.testing
import buildops.backends.triton, buildops.backends.flashinfer, buildops.backends.deep_gemm
import buildops.backends.variants
from buildops.backends.triton import autotune, build, driver, late, patches, record, stand_ins
import torch, triton
from triton.runtime.jit import JITFunction
from buildops._runtime.patching import applied
assert applied() == [], applied()
assert torch.cuda.CUDAGraph.capture_begin.__module__ != "buildops.capture"
assert JITFunction.run.__module__.startswith("triton")
print("ok")
"""


def test_importing_buildops_patches_nothing():
    result = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_every_registered_fork_callback_runs_in_the_child_in_order():
    calls = []
    first = forking.forget_in_child(lambda: calls.append("first"))
    forking.forget_in_child(lambda: calls.append("second"))
    forking.forget_in_child(first)  # once only
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, ",".join(calls).encode() or b"-")
        os._exit(0)
    os.close(write)
    assert os.read(read, 100).decode() == "first,second"
    os.waitpid(pid, 0)
    assert calls == []  # never in the parent


def test_a_lock_free_in_child_is_free_in_a_child_forked_while_another_thread_holds_it():
    lock, rlock = forking.free_in_child(threading.Lock()), forking.free_in_child(threading.RLock())

    def still_held_in_parent():
        assert lock.locked()

    # the very objects: nothing renamed them
    assert in_a_child_forked_while_held(lambda: holding(lock, rlock),
                                        lambda: lock.acquire(timeout=1) and rlock.acquire(timeout=1),
                                        still_held_in_parent)


def test_a_child_forked_while_a_thread_holds_the_runtime_state_starts_with_none_of_it_held():
    patch = patching.Patch(_owner(), "fn", lambda fn: fn, "test")
    before = runtime.gil_restore_to or sys.getswitchinterval()  # the interval before the first holder

    @contextlib.contextmanager
    def hold():
        with gil.holding(), children.building(), holding(runtime.gil_lock, runtime.children_lock, patch._lock):
            yield

    def parents_untouched():
        assert runtime.gil_holders >= 1 and len(runtime.children_running) >= 1

    def probe():
        fresh = (runtime.gil_lock.acquire(timeout=1) and runtime.children_lock.acquire(timeout=1)
                 and patch._lock.acquire(timeout=1))
        return fresh, runtime.gil_holders, len(runtime.children_running), sys.getswitchinterval() == before

    assert in_a_child_forked_while_held(hold, probe, parents_untouched) == (True, 0, 0, True)


def test_hooks_run_each_callback_once_in_order():
    hooks, calls = Hooks("test"), []
    one = hooks.add(lambda *args: calls.append(("one", args)))
    hooks.add(lambda *args: calls.append(("two", args)))
    hooks.add(one)
    hooks.run(1, 2)
    assert calls == [("one", (1, 2)), ("two", (1, 2))]


def test_backends_are_loaded_only_for_libraries_in_use(monkeypatch):
    monkeypatch.setattr(core, "backends", {})
    extensions.register(extensions.Backend("absent", "no_such_library_here", recorder="no_such_module:record",
                                           late_watchers=("no_such_module:watch",)))
    assert extensions.late_watchers() == [] and extensions.launch_recorders() == []  # nothing imported
    extensions.register(extensions.Backend("os", "os", late_watchers=("os.path:join",)))
    assert extensions.late_watchers() == [os.path.join] and extensions.backend("os").library == "os"
    with pytest.raises(ValueError, match="late_watchers.0.='os.path.join': expected 'module:attribute'"):
        extensions.Backend("os", "os", late_watchers=("os.path.join",))


def test_a_patch_of_an_inherited_attribute_leaves_the_base_visible_again():
    class Base:
        def fn(self):
            return "base"

    class Owner(Base):
        pass

    patch = patching.Patch(Owner, "fn", lambda fn: lambda self: "patched", "test")
    with patch.applied():
        assert Owner().fn() == "patched"
    assert "fn" not in vars(Owner)  # not a copy of the base's: a later change to the base shows through
    Base.fn = lambda self: "changed"
    assert Owner().fn() == "changed"


def test_a_turn_goes_to_the_first_urgent_waiter_else_to_the_oldest():
    from buildops._runtime.turns import Turns, urgency

    from conftest import until

    turns, order, release = Turns(), [], threading.Event()
    flags = {"a": False, "b": False, "c": False}

    def take(name):
        with urgency(lambda: flags[name]), turns.turn():
            order.append(name)
            if name == "holder":
                assert release.wait(WAIT)

    flags["holder"] = False
    threads = [threading.Thread(target=take, args=(name,)) for name in ("holder", "a", "b", "c")]
    threads[0].start()  # no limit yet: it waits like the others until the pool starts
    assert until(lambda: len(turns._waiting) == 1)
    turns.set_limit(1)
    assert until(lambda: order == ["holder"])
    for n, thread in enumerate(threads[1:], start=1):
        thread.start()
        assert until(lambda n=n: len(turns._waiting) == n)
    flags["c"] = True  # urgent after it began to wait
    release.set()
    for thread in threads:
        thread.join(WAIT)
    assert order == ["holder", "c", "a", "b"] and turns._held == 0
