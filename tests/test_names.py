"""Op names never merge: two ops named ``matmul`` in two modules keep their builds, report rows, recorder entries and
joins apart; an explicit ``name=`` another op has is refused at decoration; a function decorated again is the same
op."""

import importlib
import sys
import textwrap
import threading

import pytest
import torch

import buildops
from buildops import BuildConfig, DynamicSpec, lists_kernels, report
from buildops.testing import record_listings

from conftest import WAIT

MODULE = """
import threading
import torch
from buildops import Build, BuildConfig, DynamicSpec, lists_kernels

gate = threading.Event()
gate.set()

@lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
def matmul(x, w):
    return x @ w

@matmul.lister
def _(x, w):
    # the lister names its builds "matmul": the op they belong to is the one that listed them
    return [Build("matmul", ({tag!r}, x.shape[1]), lambda: gate.wait({wait}))]
"""


@pytest.fixture
def two_modules(tmp_path, monkeypatch):
    for tag in ("names_a", "names_b"):
        (tmp_path / f"{tag}.py").write_text(textwrap.dedent(MODULE.format(tag=tag, wait=WAIT)))
    monkeypatch.syspath_prepend(str(tmp_path))
    a = importlib.import_module("names_a")
    b = importlib.import_module("names_b")
    yield a, b
    for name in ("names_a", "names_b"):
        sys.modules.pop(name, None)


def test_two_matmuls_in_two_modules_never_merge(two_modules):
    a, b = two_modules
    first, second = a.matmul.op_name, b.matmul.op_name
    assert first in ("matmul", "names_a.matmul")  # "matmul" unless another module's matmul already holds it
    assert second == "names_b.matmul"
    x, w = torch.ones(4, 8), torch.ones(8, 8)
    with record_listings() as rec:
        a.matmul(x, w)
        b.matmul(x, w)
    assert rec.ops() == [first, second]
    assert [b_.op for listing in rec.listings for b_ in listing.builds] == [first, second]

    a.gate.clear()  # a's build holds; b's does not
    with buildops.rehearsal("startup"):
        a.matmul(x, w)
        b.matmul(x, w)
    assert buildops.join(op=second, timeout=WAIT) is True
    assert buildops.join(op=first, timeout=0.2) is False
    a.gate.set()
    assert buildops.join(timeout=WAIT)
    rows = {row.op: (row.listed, row.built) for row in report().ops}
    assert rows == {first: (1, 1), second: (1, 1)}


def test_an_explicit_name_another_op_has_is_refused_naming_both(two_modules):
    a, _ = two_modules
    taken = a.matmul.op_name

    def my_matmul(x, w):
        return x @ w

    with pytest.raises(ValueError, match=rf"@lists_kernels\(name='{taken}'\) on test_names\..*my_matmul: '{taken}' "
                                         rf"is already the name of the op of names_a\.matmul; two ops never share "
                                         rf"a name"):
        lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x", name=taken)(my_matmul)
    op = lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x", name="my_own_matmul")(my_matmul)
    assert op.op_name == "my_own_matmul"


def test_a_function_decorated_again_is_the_same_op(two_modules):
    a, _ = two_modules
    name = a.matmul.op_name
    kept = a.matmul
    reloaded = importlib.reload(a)  # the same module and function: not a clash, whoever still holds the old op
    assert reloaded.matmul.op_name == name and kept.op_name == name

    def make():
        @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x", name="made_by_a_factory")
        def rmsnorm(x):
            return x
        return rmsnorm

    first, second = make(), make()  # a test's factory, called twice: explicit name=, same function
    assert first.op_name == second.op_name == "made_by_a_factory"


def test_a_local_function_reads_as_its_own_name():
    def make():
        @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")
        def rms_of_a_factory(x):
            return x
        return rms_of_a_factory

    assert make().op_name == "rms_of_a_factory"


def test_a_name_stays_its_functions_whatever_is_collected(tmp_path, monkeypatch):
    """Names never depend on when an op was collected: a class made in a function (a test) lives in a reference
    cycle until a collection, and its op's name must not be free for another function's op meanwhile or after."""
    import gc

    def decorate():
        class Norm(torch.nn.Module):
            @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")
            def forward(self, x):
                return x
        return Norm

    first = decorate().forward.op_name
    gc.collect()  # the class, and its op, are gone now
    assert decorate().forward.op_name == first  # the same function again: the same name
    (tmp_path / "names_c.py").write_text(
        "import torch\nfrom buildops import BuildConfig, DynamicSpec, lists_kernels\n"
        "class Norm(torch.nn.Module):\n"
        "    @lists_kernels(BuildConfig(DynamicSpec('x', 0)), output='x')\n"
        "    def forward(self, x):\n        return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    other = importlib.import_module("names_c").Norm.forward.op_name
    assert other != first and other.startswith("names_c.")
    sys.modules.pop("names_c", None)


def test_deciding_names_on_many_threads_gives_each_module_its_own(tmp_path, monkeypatch):
    for index in range(8):
        (tmp_path / f"names_t{index}.py").write_text(
            "from buildops import BuildConfig, DynamicSpec, lists_kernels\n"
            "@lists_kernels(BuildConfig(DynamicSpec('x', 0)), output='x')\n"
            "def threaded_matmul(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {}

    def load(index):
        modules[index] = importlib.import_module(f"names_t{index}")

    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    names = [modules[i].threaded_matmul.op_name for i in range(8)]
    assert len(set(names)) == 8
    for index in range(8):
        sys.modules.pop(f"names_t{index}", None)


def test_a_recording_finds_an_op_by_its_short_name_where_it_is_unique_there(two_modules):
    a, b = two_modules
    x, w = torch.ones(4, 8), torch.ones(8, 8)
    with record_listings() as rec:
        b.matmul(x, w)  # named "names_b.matmul": another module's matmul holds the short name
    assert rec.dims("matmul") == rec.dims("names_b.matmul") == [{"x.0": 4}]
    with record_listings() as both:
        a.matmul(x, w)
        b.matmul(x, w)
    if a.matmul.op_name != "matmul":  # both qualified: the short name is ambiguous in this recording
        with pytest.raises(ValueError, match="names 2 ops in this recording"):
            both.of("matmul")
    assert both.keys("names_b.matmul") == [("names_b", 8)]


def test_a_reset_frees_the_names_of_collected_ops_only():
    from buildops.testing import reset

    def decorate(fn):
        return lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x", name="reset_name")(fn)

    def first(x):
        return x

    def second(x):
        return x

    kept = decorate(first)
    with pytest.raises(ValueError, match="already the name of the op of"):
        decorate(second)
    reset()
    with pytest.raises(ValueError, match="already the name of the op of"):
        decorate(second)  # the first op lives on: its name stays its own
    del kept
    reset()
    assert decorate(second).op_name == "reset_name"
