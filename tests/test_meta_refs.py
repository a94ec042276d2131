"""A replay runs torch's Python meta kernels without importing torch's dynamo, and leaves them as torch had them
(buildops/_core/meta_refs.py). Each check runs in a fresh process: this one has imported dynamo long ago."""

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TESTS = pathlib.Path(__file__).parent

# An op whose host code runs elementwise torch ops (each a Python reference on meta tensors, one calling another by
# name) before and after its launch, and an aten op a library overrode (through the replay's dispatch mode); listed
# in a fresh process, then what the references hold. MODE: "ahead" (the stand-ins found first, as a start's
# background thread finds them; the process forks mid-replay), "by_replay" (found by the first replay; then dynamo
# imported and more replays and a compile), "dynamo_during" (dynamo imported mid-replay, as by another thread), or
# "broken" (a torch whose wrappers cannot be walked).
PROBE = r"""
import importlib, json, os, sys
import torch
sys.path.insert(0, TESTS)
from buildops import BuildConfig, DynamicSpec, lists_kernels
from buildops.backends.triton import target
from buildops._core import meta_refs
from buildops._core.custom_ops import AtenOverrideRouter
from buildops._core.state import core
from triton_kernels import add_kernel
import dispatch_library, warnings

target()
with warnings.catch_warnings():  # torch warns that the override replaces its own kernel: it is meant to
    warnings.simplefilter("ignore", UserWarning)
    override = dispatch_library.register("CPU")  # kept: the replay routes silu through the router's dispatch mode

@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[16, 1000])), output="x")
def op(x):
    during.append(stand_ins())
    if MODE == "ahead" and "forked" not in result:
        result["forked"] = in_a_forked_child(lambda: (stand_ins(), core.meta_replays))
    if MODE == "dynamo_during":
        importlib.import_module("torch._dynamo")
    z = (x + 1) * 2 - torch.sigmoid(x) // 3  # floor division's reference calls others by name
    out = torch.empty_like(x)
    add_kernel[(1,)](z, x, out, x.numel(), BLOCK=1024)
    return torch.where(out > 0, torch.nn.functional.silu(out), z)

def stand_ins():
    import torch._decomp
    found = 0
    roots = [f for table in torch._decomp.global_decomposition_table.values() for f in table.values()]
    for fn in [*roots, vars(AtenOverrideRouter)["__torch_dispatch__"]]:
        while fn is not None:
            found += isinstance(getattr(fn, meta_refs._CACHE, None), meta_refs._UntilDynamo)
            fn = getattr(fn, "__wrapped__", None)
    return found

def in_a_forked_child(probe):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, json.dumps(probe()).encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = json.loads(os.read(read, 1000))
    os.waitpid(pid, 0)
    return answer

result, during = {}, []
if MODE == "broken":
    def _find():
        raise RuntimeError("laid out otherwise")
        yield
    meta_refs._find = _find
elif MODE == "ahead":
    meta_refs.find_stand_ins()
    result["found_ahead"] = len(core.stand_ins) > 100
x = torch.zeros(1000)
builds = op.builds_for(x)
result.update({"builds": len({b.key for b in builds}), "dynamo": "torch._dynamo" in sys.modules,
               "stand_ins_during": min(during) > 100, "stand_ins_after": stand_ins(),
               "replays_running": core.meta_replays})
if MODE == "by_replay":
    import torch._dynamo
    during.clear()
    result["again"] = len({b.key for b in op.builds_for(x)})  # dynamo imported: torch's own wrapper
    result["stand_ins_again"] = max(during)
    compiled = torch.compile(lambda a: torch._refs.add(a, a) * 2, backend="eager")
    result["compiled"] = compiled(torch.ones(3)).tolist()
    result["stand_ins_end"] = stand_ins()
print(json.dumps(result))
"""


def _probe(mode: str) -> dict:
    code = f"TESTS = {str(TESTS)!r}\nMODE = {mode!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_replay_runs_python_meta_kernels_without_importing_dynamo_and_leaves_them_as_they_were():
    result = _probe("ahead")
    assert result == {"found_ahead": True, "forked": [0, 0], "builds": 4, "dynamo": False, "stand_ins_during": True,
                      "stand_ins_after": 0, "replays_running": 0}  # a child forked mid-replay starts with none


def test_after_dynamo_is_imported_replays_and_compiles_run_on_torchs_own_wrappers():
    result = _probe("by_replay")
    assert result == {"builds": 4, "dynamo": False, "stand_ins_during": True, "stand_ins_after": 0,
                      "replays_running": 0, "again": 4, "stand_ins_again": 0, "compiled": [4.0, 4.0, 4.0],
                      "stand_ins_end": 0}


def test_dynamo_imported_during_a_replay_changes_nothing_it_lists():
    result = _probe("dynamo_during")  # the first replay's later ops go through dynamo's disable; the next has none
    assert result == {"builds": 4, "dynamo": True, "stand_ins_during": False, "stand_ins_after": 0,
                      "replays_running": 0}


def test_where_the_wrappers_cannot_be_found_replays_list_the_same_and_import_dynamo_as_before():
    result = _probe("broken")
    assert result == {"builds": 4, "dynamo": True, "stand_ins_during": False, "stand_ins_after": 0,
                      "replays_running": 0}


def test_a_stand_in_defers_to_dynamo_once_another_thread_has_imported_it():
    import torch
    import torch._dynamo  # as another thread would have, while a replay ran

    from buildops._core.meta_refs import _UntilDynamo

    calls = []

    def reference(a, b):
        calls.append(torch._dynamo.is_compiling())
        return a + b

    stand_in = _UntilDynamo(reference, recursive=True)
    assert stand_in(1, 2) == 3 and calls == [False]
    compiled = torch.compile(lambda t: stand_in(t, t), backend="eager")
    assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
    assert calls[-1] is False  # run as dynamo's disable runs it: outside the trace, not traced into
