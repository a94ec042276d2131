"""Inputs the decorators and specs once accepted and should not (issue 23, items 8-14): each is refused with an
error that names the op (or spec), the argument and the fix, at decoration where it can be told there."""

import sys

import pytest
import torch

from buildops import Build, BuildConfig, DynamicSpec, SpecError, builds_by_running, lists_kernels, settings
from buildops.testing import record_listings

DECORATORS = [("lists_kernels", lists_kernels), ("builds_by_running", builds_by_running)]
ROWS = BuildConfig(DynamicSpec("x", 0, sweep="exact"))


def _no_builds(*args, **kwargs):
    return []


# -- 8: a sweep is a named sweep, a sequence of ints, a range or a callable -------------------------------------

@pytest.mark.parametrize("sweep", [b"ab", bytearray(b"ab"), memoryview(b"ab")])
def test_bytes_are_not_a_sweep(sweep):
    with pytest.raises(SpecError) as raised:
        DynamicSpec("x", dim=0, sweep=sweep)
    message = str(raised.value)
    assert message.startswith("DynamicSpec('x', dim=0): sweep=")  # the spec and the argument
    assert f"is {type(sweep).__name__}, not a sweep" in message
    assert "a sequence of ints (e.g. sweep=[1, 16, 128])" in message  # what a sweep may be
    assert "'pow2'" in message and "a range, or a callable" in message


@pytest.mark.parametrize("sweep, bad", [([1, 2.0], "[2.0]"), ([1, "16"], "['16']"), ((True, 4), "[True]")])
def test_a_sweep_of_other_items_than_ints_says_what_a_sweep_may_be(sweep, bad):
    with pytest.raises(SpecError) as raised:
        DynamicSpec("x", dim=0, sweep=sweep)
    message = str(raised.value)
    assert message.startswith("DynamicSpec('x', dim=0): sweep buckets must be")
    assert f"got {bad}" in message
    assert "a sequence of ints (e.g. sweep=[1, 16, 128])" in message


def test_a_string_is_only_a_named_sweep():
    with pytest.raises(SpecError, match=r"DynamicSpec\('x', dim=0\): unknown sweep 'ab'; use one of "
                                        r"\('pow2', 'pow2_odd', 'exact'\)"):
        DynamicSpec("x", dim=0, sweep="ab")


# -- 9: one dim named by two specs ------------------------------------------------------------------------------

@pytest.mark.parametrize("first, second", [(0, 0), (-1, -1)])
def test_the_same_dim_twice_fails_at_decoration(first, second):
    config = BuildConfig(DynamicSpec("x", first), DynamicSpec(0, second, name="again"))
    with pytest.raises(SpecError) as raised:
        @lists_kernels(config, output="x")
        def rows_named_twice(x):
            return x
    message = str(raised.value)
    assert message.startswith("rows_named_twice: ")
    assert f"argument 'x' dim {second} is named by two specs" in message and "'again'" in message
    assert message.endswith("keep one")


def test_an_argument_swept_as_a_tensor_and_as_an_int_fails_at_decoration():
    config = BuildConfig(DynamicSpec("n", None), DynamicSpec("n", 0))
    with pytest.raises(SpecError) as raised:
        @lists_kernels(config, output=None)
        def int_and_tensor(n):
            pass
    message = str(raised.value)
    assert message == ("int_and_tensor: argument 'n' is swept as a tensor by DynamicSpec('n', dim=0) ('n.0') and as "
                       "an int by DynamicSpec('n', dim=None) ('n'); it is one or the other: keep one")


def _rows_both_ways():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact"), DynamicSpec("x", -2, sweep="exact")),
                   output="x")
    def rows_both_ways(x):
        return x

    rows_both_ways.lister(_no_builds)
    return rows_both_ways


def test_dims_counted_from_either_end_that_meet_fail_at_the_first_call_in_a_pass():
    op = _rows_both_ways()  # dim=0 and dim=-2: one dim of a 2-D tensor, two of a 3-D one: decoration cannot tell
    with pytest.raises(SpecError) as raised, record_listings():
        op(torch.zeros(4, 8))
    message = str(raised.value)
    assert message.startswith(op.op_name + ": ")
    assert ("DynamicSpec('x', dim=0) ('x.0') and DynamicSpec('x', dim=-2) ('x.-2') name the same dim of argument "
            "'x', which has 2 dimension(s), shape (4, 8)") in message
    assert message.endswith("keep one")
    with pytest.raises(SpecError, match="name the same dim of argument 'x'"):
        op.builds_for(torch.zeros(4, 8, device="meta"))


def test_dims_counted_from_either_end_that_do_not_meet_are_two_dims():
    op = _rows_both_ways()
    with record_listings() as rec:
        op(torch.zeros(4, 8, 2))
    assert rec.dims(op.op_name) == [{"x.0": 4, "x.-2": 8}]


# -- 10-12: a class, an async def, a generator function ---------------------------------------------------------

@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("decorator, decorate", DECORATORS)
def test_a_class_is_refused_and_left_as_it_was(decorator, decorate, enabled):
    class Norm(torch.nn.Module):
        def forward(self, x):
            return x

    with settings.scope(enabled=enabled), pytest.raises(TypeError) as raised:
        decorate(ROWS, output="x")(Norm)
    assert str(raised.value) == (
        f"@{decorator} cannot decorate the class Norm: an op is a function or method, and a class is neither "
        f"(calling it makes an instance); decorate the method of Norm that launches the kernels instead, e.g. "
        f"@{decorator}(...) above its `def forward(self, ...)`")
    assert not hasattr(Norm, "lister") and not hasattr(Norm, "op_name")  # not modified in place


async def fetch_rows(x):
    return x


async def stream_rows_async(x):
    yield x


def stream_rows(x):
    yield x


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("decorator, decorate", DECORATORS)
@pytest.mark.parametrize("fn, kind, made", [
    (fetch_rows, "async function", "a coroutine"),
    (stream_rows_async, "async generator function", "an async generator"),
    (stream_rows, "generator function", "a generator"),
])
def test_functions_whose_calls_run_none_of_their_body_are_refused(decorator, decorate, fn, kind, made, enabled):
    with settings.scope(enabled=enabled), pytest.raises(TypeError) as raised:
        decorate(ROWS, output="x")(fn)
    assert str(raised.value) == (
        f"@{decorator} cannot decorate the {kind} {fn.__name__}: a call of it runs none of its body, it only makes "
        f"{made}, so buildops could neither list the kernels a call launches nor return a placeholder for it in a "
        f"pass; decorate the plain function (a def with no yield) that it calls to launch its kernels instead")
    assert not hasattr(fn, "lister")


def test_a_method_that_is_async_is_refused_too():
    with pytest.raises(TypeError, match=r"cannot decorate the async function Model\.forward: .* decorate the plain "
                                        r"function"):
        class Model(torch.nn.Module):
            @lists_kernels(ROWS, output="x")
            async def forward(self, x):
                return x


# -- 13: a method whose first parameter is not named self -------------------------------------------------------

@pytest.mark.parametrize("decorator, decorate", DECORATORS)
def test_a_method_whose_instance_is_not_named_self_lists_in_a_pass(decorator, decorate):
    class Scale(torch.nn.Module):
        @decorate(ROWS, output="x")
        def forward(this, x):
            return x * 2

    if decorator == "lists_kernels":
        Scale.forward.lister(lambda this, x: [Build("Scale.forward", ("scale", x.shape), lambda: None)])
    model = Scale()
    with record_listings() as rec:  # its first call: nothing outside a pass settled it as a method before
        assert torch.equal(model(torch.ones(3, 2)), torch.zeros(3, 2))
        assert torch.equal(model.forward(torch.ones(5, 4)), torch.zeros(5, 4))  # another signature: it lists
    assert rec.dims(Scale.forward.op_name) == [{"x.0": 3}, {"x.0": 5}]
    assert torch.equal(model(torch.ones(2, 2)), torch.full((2, 2), 2.0))


# -- 14: a sweep= callable that raises ---------------------------------------------------------------------------

def _broken_sweep(seen):
    raise ZeroDivisionError("division by zero")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_a_sweep_callable_that_raises_names_the_op_and_the_spec():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=_broken_sweep, name="tokens")), output="x")
    def rows_by_callable(x):
        return x

    rows_by_callable.lister(_no_builds)
    with pytest.raises(ZeroDivisionError) as raised, record_listings():  # its own type, for whoever catches it
        rows_by_callable(torch.zeros(6, 2))
    assert raised.value.__notes__ == [
        f"buildops: raised by the sweep= callable of DynamicSpec('x', dim=0) ('tokens') of op "
        f"{rows_by_callable.op_name} at the call's value 6"]


def test_a_sweep_callable_that_gives_other_than_ints_names_the_op_and_the_spec():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=lambda v: [v / 2])), output="x")
    def rows_halved(x):
        return x

    rows_halved.lister(_no_builds)
    with pytest.raises(SpecError) as raised, record_listings():
        rows_halved(torch.zeros(6, 2))
    assert str(raised.value) == (f"{rows_halved.op_name}: DynamicSpec('x', dim=0): its sweep gave [3.0] for the "
                                 f"call's value 6; a sweep must give ints >= 0")
