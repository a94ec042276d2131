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
# name) before and after its launch, and an aten op a library overrode (through the replay's dispatch mode); then
# what the references hold once the replays are done.
PROBE = r"""
import json, sys
import torch
sys.path.insert(0, TESTS)
from buildops import BuildConfig, DynamicSpec, lists_kernels
from buildops.backends.triton import target
from buildops._core.meta_refs import _CACHE, _UntilDynamo
from triton_kernels import add_kernel
import dispatch_library, warnings

target()
with warnings.catch_warnings():  # torch warns that the override replaces its own kernel: it is meant to
    warnings.simplefilter("ignore", UserWarning)
    override = dispatch_library.register("CPU")  # kept: the replay routes silu through the router's dispatch mode

@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[16, 1000])), output="x")
def op(x):
    during.append(stand_ins())
    z = (x + 1) * 2 - torch.sigmoid(x) // 3  # floor division's reference calls others by name
    out = torch.empty_like(x)
    add_kernel[(1,)](z, x, out, x.numel(), BLOCK=1024)
    return torch.where(out > 0, torch.nn.functional.silu(out), z)

def stand_ins():
    import torch._decomp
    found = 0
    for table in torch._decomp.global_decomposition_table.values():
        for fn in table.values():
            while fn is not None:
                found += isinstance(getattr(fn, _CACHE, None), _UntilDynamo)
                fn = getattr(fn, "__wrapped__", None)
    return found

result = {}
if BROKEN:  # a torch whose wrappers cannot be walked: replays go on as without buildops
    import buildops._core.meta_refs as meta_refs
    def _find():
        raise RuntimeError("laid out otherwise")
        yield
    meta_refs._find = _find
elif not MORE:  # found ahead, as a start's background thread does; else by the first replay
    from buildops._core.meta_refs import find_stand_ins
    from buildops._core.state import core
    find_stand_ins()
    result["found_ahead"] = len(core.stand_ins) > 100
during = []
x = torch.zeros(1000)
builds = op.builds_for(x)
from buildops._core.state import core
result.update({"builds": len({b.key for b in builds}), "dynamo": "torch._dynamo" in sys.modules,
               "stand_ins_during": min(during) > 100, "stand_ins_after": stand_ins(),
               "replays_running": core.meta_replays})
if MORE:
    import torch._dynamo
    during.clear()
    result["again"] = len({b.key for b in op.builds_for(x)})  # dynamo imported: torch's own wrapper
    result["stand_ins_again"] = max(during)
    compiled = torch.compile(lambda a: torch._refs.add(a, a) * 2, backend="eager")
    result["compiled"] = compiled(torch.ones(3)).tolist()
    result["stand_ins_end"] = stand_ins()
print(json.dumps(result))
"""


def _probe(more: bool, broken: bool = False) -> dict:
    code = f"TESTS = {str(TESTS)!r}\nMORE = {more}\nBROKEN = {broken}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=TESTS.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_replay_runs_python_meta_kernels_without_importing_dynamo_and_leaves_them_as_they_were():
    result = _probe(more=False)
    assert result == {"found_ahead": True, "builds": 4, "dynamo": False, "stand_ins_during": True,
                      "stand_ins_after": 0, "replays_running": 0}


def test_after_dynamo_is_imported_replays_and_compiles_run_on_torchs_own_wrappers():
    result = _probe(more=True)
    assert result == {"builds": 4, "dynamo": False, "stand_ins_during": True, "stand_ins_after": 0,
                      "replays_running": 0, "again": 4,
                      "stand_ins_again": 0, "compiled": [4.0, 4.0, 4.0], "stand_ins_end": 0}


def test_where_the_wrappers_cannot_be_found_replays_list_the_same_and_import_dynamo_as_before():
    result = _probe(more=False, broken=True)
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
