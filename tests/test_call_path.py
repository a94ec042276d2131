"""The call path outside a pass: a call skips the op's wrapper where no pass was made current in its context and
none of the op's builds is pending; methods bind as functions do."""

import contextvars
import inspect
import pydoc
import sys
import threading
import types

import pytest
import torch
from torch import nn

import buildops
from buildops import BuildConfig, DynamicSpec, build_pass, lists_kernels, rehearsal
from buildops._core.ops import OpCore
from buildops._core.passes import in_pass as in_pass_mark
from buildops.testing import record_listings

from conftest import WAIT


def op_listing(runs, name="op", **build_kwargs):
    """An op with one build per call signature: key (name, x.shape[1]); dim 0 is swept "exact"."""
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name=name)
    def op(x):
        return x + 1

    op.lister(lambda x: [runs.build(name, (name, x.shape[1]), **build_kwargs)])
    return op


class Scale(nn.Module):
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
    def forward(self, x, scale=2.0):
        """Scale x."""
        return x * scale


def wrapper_calls(call):
    """How many times ``call()`` entered an op's wrapper (``OpCore.call``), on this thread."""
    entered = []

    def profile(frame, event, _arg):
        if event == "call" and frame.f_code is OpCore.call.__code__:
            entered.append(frame)

    before = sys.getprofile()
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(before)
    return len(entered)


def in_pass():
    """Whether this context is marked as in a pass (what the op wrappers check first)."""
    return in_pass_mark.get(False)


def test_outside_passes_with_nothing_pending_no_call_enters_the_wrapper(runs):
    op, model = op_listing(runs), Scale()
    x = torch.ones(2, 3)
    assert wrapper_calls(lambda: op(x)) == 0
    assert wrapper_calls(lambda: model.forward(x)) == 0
    assert wrapper_calls(lambda: model(x)) == 0
    assert wrapper_calls(lambda: Scale.forward(model, x)) == 0
    with build_pass("warmup"):
        assert wrapper_calls(lambda: op(x)) == 1 and wrapper_calls(lambda: model(x)) == 1
    assert wrapper_calls(lambda: op(x)) == 0 and wrapper_calls(lambda: model(x)) == 0
    assert torch.equal(op(x), x + 1) and torch.equal(model(x), x * 2)


def test_a_context_is_marked_in_a_pass_from_its_start_to_its_end_even_when_it_raises():
    assert not in_pass()
    with build_pass("outer") as outer:
        assert in_pass()
        with rehearsal("inner"):
            assert in_pass()
        assert in_pass()
        with pytest.raises(KeyError), build_pass("raises"):
            raise KeyError("x")
        assert in_pass()
    assert not in_pass()
    with pytest.raises(RuntimeError), outer:  # a pass entered again, and raising
        assert in_pass()
        raise RuntimeError("body")
    assert not in_pass()
    with buildops.settings.scope(enabled=False), build_pass("off"):  # BUILDOPS=0: a plain block
        assert not in_pass()


def test_a_pass_in_another_thread_leaves_calls_here_on_the_fast_path(runs):
    op, listed_elsewhere, model = op_listing(runs), op_listing(runs, name="elsewhere"), Scale()
    entered, leave = threading.Event(), threading.Event()
    inside = {}

    def other():
        with build_pass("elsewhere"):
            inside["marked"] = in_pass()
            inside["listed"] = listed_elsewhere(torch.ones(2, 3))
            entered.set()
            assert leave.wait(WAIT)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert entered.wait(WAIT) and not in_pass()
        assert wrapper_calls(lambda: op(torch.ones(2, 3))) == 0 and wrapper_calls(lambda: model(torch.ones(1))) == 0
        assert torch.equal(op(torch.ones(2, 3)), torch.full((2, 3), 2.0))
    finally:
        leave.set()
        thread.join(WAIT)
    assert not thread.is_alive() and inside["marked"] and torch.equal(inside["listed"], torch.zeros(2, 3))
    assert runs.calls == [("elsewhere", 3)]


def test_a_context_copied_inside_a_pass_lists_in_another_thread_until_the_pass_ends(runs):
    op, model = op_listing(runs), Scale()
    result = {}

    def call_in_thread(context, key):
        thread = threading.Thread(target=lambda: result.__setitem__(key, context.run(lambda: (
            op(torch.ones(2, 3)), model(torch.ones(2, 3))))))
        thread.start()
        thread.join(WAIT)

    with rehearsal("startup"):
        copied = contextvars.copy_context()
        call_in_thread(copied, "inside")
    assert buildops.join(timeout=WAIT)
    call_in_thread(copied, "after")
    assert all(torch.equal(out, torch.zeros(2, 3)) for out in result["inside"])  # placeholders: it listed
    assert torch.equal(result["after"][0], torch.full((2, 3), 2.0))  # ran: the pass in its context has ended
    assert torch.equal(result["after"][1], torch.full((2, 3), 2.0))
    assert runs.calls == [("op", 3)]


def test_pending_builds_send_their_own_ops_calls_through_the_wrapper_until_they_settle(runs):
    gate = threading.Event()
    op, other = op_listing(runs, gate=gate), op_listing(runs, name="other")
    try:
        with rehearsal("startup"):
            op(torch.ones(2, 3))
        assert runs.started.wait(WAIT) and op._self_op.pending.futures
        assert wrapper_calls(lambda: other(torch.ones(2, 3))) == 0  # nothing of its own pending
        waited = {}
        thread = threading.Thread(target=lambda: waited.setdefault("out", op(torch.ones(4, 3))))
        thread.start()
        thread.join(0.2)
        assert thread.is_alive()  # waits for its build
    finally:
        gate.set()
    thread.join(WAIT)
    assert torch.equal(waited["out"], torch.full((4, 3), 2.0))
    assert buildops.join(timeout=WAIT) and not op._self_op.pending.futures
    assert wrapper_calls(lambda: op(torch.ones(2, 3))) == 0


def test_after_a_shutdown_forgot_pending_builds_new_ones_are_waited_for(runs):
    first, second = threading.Event(), threading.Event()
    op = op_listing(runs, gate=first)
    with rehearsal("startup"):
        op(torch.ones(2, 3))
    assert runs.started.wait(WAIT) and op._self_op.pending.futures
    first.set()
    buildops.shutdown(wait=True, timeout=WAIT)
    assert not op._self_op.pending.futures and wrapper_calls(lambda: op(torch.ones(2, 3))) == 0

    runs.started.clear()
    op.lister(lambda x: [runs.build("op", ("again", x.shape[1]), gate=second)])
    try:
        with rehearsal("again"):
            op(torch.ones(2, 5))
        assert runs.started.wait(WAIT)
        waited = {}
        thread = threading.Thread(target=lambda: waited.setdefault("out", op(torch.ones(4, 5))))
        thread.start()
        thread.join(0.2)
        assert thread.is_alive()  # the forgotten builds' op still waits for its new ones
    finally:
        second.set()
    thread.join(WAIT)
    assert not thread.is_alive() and torch.equal(waited["out"], torch.full((4, 5), 2.0))


def test_a_bound_method_is_a_method_of_the_op_and_lists_in_a_pass():
    model = Scale()
    bound = model.forward  # taken outside the pass, called inside it
    assert type(bound) is types.MethodType and bound.__self__ is model
    assert bound.__func__ is Scale.__dict__["forward"] and bound == model.forward
    assert str(inspect.signature(bound)) == "(x, scale=2.0)"
    assert str(inspect.signature(Scale.forward)) == "(self, x, scale=2.0)"
    assert bound.__name__ == "forward" and bound.__doc__ == "Scale x." and bound.op_name == "Scale.forward"
    assert "forward(x, scale=2.0) method of test_call_path.Scale instance" in pydoc.render_doc(bound, "%s",
                                                                                             renderer=pydoc.plaintext)
    with record_listings() as recorded:
        assert torch.equal(bound(torch.ones(3, 2)), torch.zeros(3, 2))
        assert torch.equal(Scale.forward(model, torch.ones(4, 5)), torch.zeros(4, 5))
    assert recorded.dims("Scale.forward") == [{"x.0": 3}, {"x.0": 4}]

    class Doubled(Scale):
        def forward(self, x, scale=2.0):
            return super().forward(x, scale) * 2

    assert torch.equal(Doubled()(torch.ones(1)), torch.full((1,), 4.0))


def test_a_method_only_a_call_shows_settles_once(monkeypatch):
    @lists_kernels(BuildConfig(DynamicSpec(0, dim=0, sweep="exact")), output=lambda module, x: torch.zeros_like(x))
    def forward(module, x):  # not named self: only a call through an instance shows the op is a method
        return x * module.scale

    forward.lister(lambda module, x: [])
    op = forward._self_op
    resolved = []
    resolve = op._resolve
    monkeypatch.setattr(op, "_resolve", lambda method: resolved.append(method) or resolve(method))

    class Model(nn.Module):
        scale = 3.0

    Model.forward = forward
    model = Model()
    assert torch.equal(model(torch.ones(2)), torch.full((2,), 3.0)) and not op.method  # nothing shows it here
    with record_listings() as recorded:
        for x in (torch.ones(2), torch.ones(5, 3), torch.ones(4)):  # two call signatures, three calls
            assert torch.equal(model(x), torch.zeros_like(x))
    assert op.method and resolved == [True]
    assert recorded.dims(op.name) == [{"0.0": 2}, {"0.0": 5}]  # dim 0 of x, the call's first own argument
