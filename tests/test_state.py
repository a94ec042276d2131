"""Each layer's process-wide state is one object with a ``reset`` and an ``after_fork``, registered once; a
backend's is in a module that imports no library (workers and ``buildops.startup`` import it before torch)."""

import ast
import contextlib
import pathlib
import threading

import pytest

import buildops
from buildops._runtime import forking
from buildops._runtime.hooks import on_reset

from conftest import holding, in_a_child_forked_while_held

PACKAGE = pathlib.Path(buildops.__file__).parent
STATE_MODULES = ("backends/triton/state.py", "backends/flashinfer/state.py", "backends/deep_gemm/state.py")
LIBRARIES = ("torch", "triton", "flashinfer", "deep_gemm")


def _states() -> list:
    pytest.importorskip("triton")
    from buildops._core.state import core
    from buildops._runtime.state import runtime
    from buildops.backends.deep_gemm.state import deep_gemm_state
    from buildops.backends.flashinfer.state import flashinfer_state
    from buildops.backends.triton.state import triton_state
    from buildops.backends.variants import variants_state

    return [runtime, core, triton_state, flashinfer_state, deep_gemm_state, variants_state]


def test_a_state_module_imports_no_library_and_no_module_of_its_package():
    found = []
    for name in STATE_MODULES:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if isinstance(node, ast.Import):
                found += [f"{name}: {alias.name}" for alias in node.names if alias.name.split(".")[0] in LIBRARIES]
            elif isinstance(node, ast.ImportFrom) and (
                    node.level == 1 or (not node.level and (node.module or "").split(".")[0] in LIBRARIES)):
                found.append(f"{name}: from {'.' * node.level}{node.module}")
    assert found == []


def test_each_state_registers_its_reset_and_after_fork_once():
    for state in _states():
        assert forking._callbacks.count(state.after_fork) == 1, type(state).__name__
        assert on_reset._callbacks.count(state.reset) == 1, type(state).__name__


def test_a_forked_child_gets_every_lock_of_each_state_free_and_no_build_under_way():
    from buildops.backends.deep_gemm.entries import entries_being_made, making_entries

    states = _states()
    locks = [(state, name) for state in states for name, value in vars(state).items()
             if isinstance(value, type(threading.Lock()))]
    assert len(locks) >= 20

    from buildops.backends.flashinfer.state import flashinfer_state

    slot = threading.BoundedSemaphore(1)

    @contextlib.contextmanager
    def hold():  # another thread holds every lock, a DeepGEMM build and a FlashInfer build slot, as the process forks
        with making_entries(), holding(*(getattr(state, name) for state, name in locks)), slot:
            yield

    def probe():  # the counts first: reading them takes one of the locks
        fresh = entries_being_made() == (0, 0) and flashinfer_state.build_slots is None
        return fresh and all(getattr(state, name).acquire(timeout=1) for state, name in locks)

    slots, flashinfer_state.build_slots = flashinfer_state.build_slots, slot
    try:
        assert in_a_child_forked_while_held(hold, probe)
    finally:
        flashinfer_state.build_slots = slots
