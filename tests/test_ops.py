import inspect
import logging
import threading

import pytest
import torch
from torch import nn

import buildops
from buildops import (
    Build,
    BuildConfig,
    DynamicSpec,
    SpecError,
    TensorSpec,
    build_pass,
    builds_by_running,
    lists_kernels,
    rehearsal,
    report,
    settings,
)
from buildops._core.default import current_builder, default_builder
from buildops.testing import record_listings

from conftest import WAIT, until, waiting_on


def make_rmsnorm(runs=None, gate=None, fail=False):
    """An op whose kernel depends on the hidden size and dtype only (as a Triton RMSNorm's BLOCK does)."""
    seen = []

    @lists_kernels(BuildConfig(DynamicSpec("x", dim=0)), output="x")
    def rmsnorm(x, weight, eps=1e-6):
        """Normalize rows."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    @rmsnorm.lister
    def _(x, weight, eps):
        seen.append((x, weight, eps))
        key = ("rmsnorm", x.dtype, x.shape[1])
        return [runs.build("rmsnorm", key, gate=gate, fail=fail)] if runs else []

    return rmsnorm, seen


def test_lists_once_per_signature_and_only_in_a_pass(runs):
    rmsnorm, seen = make_rmsnorm(runs)
    x, w = torch.randn(100, 8), torch.ones(8)
    assert torch.allclose(rmsnorm(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert seen == []  # outside a pass: runs for real, lists nothing

    with build_pass("warmup"):
        out = rmsnorm(x, w)
        assert torch.equal(out, torch.zeros_like(x))
        assert [s[0].shape[0] for s in seen] == [100, 1, 2, 4, 8, 16, 32, 64]  # the call's own shape first
        assert all(isinstance(s[0], TensorSpec) and s[0].shape[1] == 8 for s in seen)
        assert all(s[1] == TensorSpec((8,), torch.float32) and s[2] == 1e-6 for s in seen)
        rmsnorm(torch.randn(37, 8), w)          # same signature: the swept dim differs only
        assert len(seen) == 8
        rmsnorm(torch.randn(4, 16), torch.ones(16))  # new signature: lists again
        assert len(seen) == 8 + 3
    # every swept shape of one signature needs the same kernel: one build per hidden size
    assert sorted(runs.calls, key=str) == [("rmsnorm", torch.float32, 16), ("rmsnorm", torch.float32, 8)]
    stats = report().ops[0]
    assert (stats.listed, stats.shared, stats.built) == (11, 9, 2)


def test_builds_shared_across_ops_run_once(runs):
    def lister(x):
        return [runs.build("any", ("the-kernel", x.dtype))]

    first = lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")(lambda x: x)
    second = lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")(lambda x: x)
    first.lister(lister)
    second.lister(lister)
    with build_pass("warmup"):
        first(torch.empty(3))
        second(torch.empty(5))
    assert runs.calls == [("the-kernel", torch.float32)]


def test_failed_build_is_left_to_the_op(runs, caplog):
    rmsnorm, _ = make_rmsnorm(runs, fail=True)
    x, w = torch.randn(4, 8), torch.ones(8)
    with caplog.at_level(logging.WARNING, logger="buildops"), build_pass("warmup"):
        rmsnorm(x, w)
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "will compile it on first use" in failures[0].getMessage()
    assert torch.allclose(rmsnorm(x, w), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    rep = report()
    assert rep.ops[0].failed == 1 and "compiler crashed" in rep.failures[0][2]


def test_op_outside_a_pass_waits_for_its_own_build(runs):
    gate = threading.Event()
    rmsnorm, _ = make_rmsnorm(runs, gate=gate)
    with rehearsal("startup"):
        rmsnorm(torch.randn(4, 8), torch.ones(8))
    assert runs.started.wait(WAIT)

    other_signature = rmsnorm(torch.randn(4, 16), torch.ones(16))  # nothing pending for it: runs at once
    assert other_signature.shape == (4, 16)

    result = {}
    caller = threading.Thread(target=lambda: result.setdefault("out", rmsnorm(torch.ones(2, 8), torch.ones(8))))
    caller.start()
    caller.join(0.3)
    assert caller.is_alive() and "out" not in result  # held by the build in flight
    gate.set()
    caller.join(WAIT)
    assert not caller.is_alive() and result["out"].shape == (2, 8)
    assert report().ops[0].wait_seconds > 0.2
    # Settled (a future's done callbacks run just after its waiters wake): later calls take the fast path
    assert until(lambda: not rmsnorm._self_op.pending.futures)


def test_a_serving_call_moves_its_builds_ahead_of_the_rest_of_the_start(runs):
    gate = threading.Event()

    def op_swept_at(name, sweep):
        @lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=sweep)), output="x", name=name)
        def op(x):
            return x

        op.lister(lambda x: [runs.build(name, (name, x.shape[0]))])
        return op

    # Called in the rehearsal at shapes their sweeps do not hold: nothing of theirs goes ahead at the start.
    other, norm = op_swept_at("other", [1, 2, 3]), op_swept_at("norm", [1, 2])
    with settings.scope(threads=1):
        builder = default_builder()
        builder.submit(runs.build("blocker", "blocker", gate=gate))  # holds the one worker
        with rehearsal("startup"):
            other(torch.zeros(5, 4))
            norm(torch.zeros(5, 8))
    assert runs.started.wait(WAIT)
    waiting = waiting_on(builder)
    result = {}
    caller = threading.Thread(target=lambda: result.setdefault("out", norm(torch.ones(2, 8))))
    caller.start()
    assert waiting.wait(WAIT)
    gate.set()
    caller.join(WAIT)
    assert not caller.is_alive() and result["out"].shape == (2, 8)
    assert buildops.join(timeout=WAIT)
    # The serving call's own shape first; not the rest of its op's sweep.
    assert runs.calls == ["blocker", ("norm", 2), ("other", 1), ("other", 2), ("other", 3), ("norm", 1)]


def test_the_shapes_a_rehearsal_calls_go_ahead_of_the_rest_of_the_sweep(runs):
    gate = threading.Event()

    @lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[1, 2, 3])), output="x")
    def other(x):
        return x

    other.lister(lambda x: [runs.build("other", ("other", x.shape[0]))])
    with settings.scope(threads=1):
        default_builder().submit(runs.build("blocker", "blocker", gate=gate))  # holds the one worker
        assert runs.started.wait(WAIT)
        with rehearsal("startup") as rehearsing:
            other(torch.zeros(3, 4))
            other(torch.zeros(2, 4))  # a later call of the signature, at a swept shape: named too
            other(torch.zeros(7, 4))  # at a shape the sweep does not hold: lists nothing more
        gate.set()
        assert rehearsing.wait_for_called_shapes(timeout=WAIT)
        assert buildops.join(timeout=WAIT)
    assert runs.calls == ["blocker", ("other", 3), ("other", 2), ("other", 1)]
    assert len(rehearsing.called) == 2


def test_methods_and_module_forward_keep_their_identity(runs):
    class Attention(nn.Module):
        def __init__(self, heads):
            super().__init__()
            self.heads = heads

        @lists_kernels(BuildConfig(DynamicSpec(0, dim=0)), output=lambda self, q, scale=1.0: torch.zeros_like(q))
        def forward(self, q, scale=1.0):
            """Attend."""
            return q * scale

    @Attention.forward.lister
    def _(self, q, scale):
        return [runs.build("Attention.forward", ("attn", self.heads, q.shape[0]))]

    assert Attention.forward.__name__ == "forward" and Attention.forward.__doc__ == "Attend."
    assert list(inspect.signature(Attention.forward).parameters) == ["self", "q", "scale"]
    small, large = Attention(2), Attention(4)
    with build_pass("warmup"):
        assert torch.equal(small(torch.ones(3, 2)), torch.zeros(3, 2))
        large(torch.ones(3, 2), scale=2.0)
    assert sorted(runs.calls) == [("attn", 2, 1), ("attn", 2, 2), ("attn", 2, 3),
                                  ("attn", 4, 1), ("attn", 4, 2), ("attn", 4, 3)]
    assert torch.equal(large(torch.ones(3, 2), scale=2.0), torch.full((3, 2), 2.0))


def test_builds_by_running_runs_the_op_at_each_swept_shape():
    ran = []

    @builds_by_running(BuildConfig(DynamicSpec("x", 0, sweep=[2, 8])), dims={"out": 0}, output="out")
    def scale_into(x, out, factor, weight):
        ran.append((x.shape, out.shape, factor, threading.current_thread().name, weight.data_ptr()))
        out.copy_(x * factor)
        return out

    x, out, weight = torch.arange(12.0).reshape(4, 3), torch.full((4, 3), -1.0), torch.ones(1000)
    with build_pass("warmup"):
        placeholder = scale_into(x, out, 2.0, weight)
        scale_into(torch.ones(6, 3), torch.ones(6, 3), 2.0, weight)  # same signature
    assert torch.equal(placeholder, torch.zeros(4, 3))
    assert sorted(r[:3] for r in ran) == [((2, 3), (2, 3), 2.0), ((8, 3), (8, 3), 2.0)]
    assert all(name.startswith("buildops-worker") for *_, name, _ in ran)
    assert torch.equal(out, torch.full((4, 3), -1.0))  # out follows x (dims=): the runs wrote into copies of it
    assert {pointer for *_, pointer in ran} == {weight.data_ptr()}  # what no dim follows is passed as it is
    assert torch.equal(scale_into(x, out, 2.0, weight), x * 2)


def test_a_build_that_calls_another_op_does_not_wait_for_builds_queued_behind_it():
    built = []

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1, 2, 4])), output="x")
    def inner(x):
        return x

    inner.lister(lambda x: [Build("inner", ("inner", x.shape[0]), lambda: built.append(x.shape[0]))])

    @builds_by_running(BuildConfig(DynamicSpec("x", 0, sweep=[1, 2, 4])), output="x")
    def outer(x):
        threading.Event().wait(0.2)  # long enough for inner's builds to be queued behind this one's
        return inner(x)

    done = threading.Event()

    def warm_up():
        with buildops.settings.scope(threads=3), build_pass("warmup"):  # as many workers as outer has builds
            inner(outer(torch.zeros(4, 8)))
        done.set()

    threading.Thread(target=warm_up, daemon=True).start()
    assert done.wait(WAIT), "the pass never ended: outer's runs waited for inner's builds behind them"
    assert sorted(built) == [1, 2, 4]


def test_builds_by_running_tiles_with_the_calls_data():
    seen = []

    @builds_by_running(BuildConfig(DynamicSpec("ids", 0, sweep=[1, 5])))
    def gather(table, ids):
        seen.append(ids.tolist())
        return table[ids]

    with build_pass("warmup"):
        assert gather(torch.randn(10, 2), torch.tensor([7, 3])) is None
    assert sorted(seen) == [[7], [7, 3, 7, 3, 7]]  # cut, and tiled from valid indices


def test_disabled_adds_no_wrapper_and_passes_are_plain_blocks():
    def rmsnorm(x):
        return x + 1

    with settings.scope(enabled=False):
        decorated = lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x")(rmsnorm)
        assert decorated is rmsnorm

        @decorated.lister  # still accepted, so modules that register listers import unchanged
        def _(x):
            raise AssertionError("never called")

        running = builds_by_running(BuildConfig(DynamicSpec("x", 0)))(rmsnorm)
        assert running is rmsnorm
        # off means the function itself, whatever the decorator's arguments (as for @lists_kernels)
        assert builds_by_running(BuildConfig(DynamicSpec("x", 0)), dims={"out": "0"})(rmsnorm) is rmsnorm
        with build_pass("warmup"):
            assert torch.equal(decorated(torch.zeros(2)), torch.ones(2))
    assert current_builder() is None


def test_misuse_fails_at_decoration_with_the_op_named():
    with pytest.raises(SpecError, match=r"f: DynamicSpec\('y', dim=0\) names no argument of f"):
        @lists_kernels(BuildConfig(DynamicSpec("y", 0)))
        def f(x):
            pass
    with pytest.raises(SpecError, match=r"output='out' names no argument"):
        @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="out")
        def g(x):
            pass
    with pytest.raises(TypeError, match=r"@lists_kernels on h: expected a BuildConfig"):
        @lists_kernels(DynamicSpec("x", 0))
        def h(x):
            pass
    with pytest.raises(SpecError, match=r"on two: dims=\{'out': 0\}: the config sweeps \['x.0', 'y.0'\]; say "
                                        r"which one it follows"):
        @builds_by_running(BuildConfig(DynamicSpec("x", 0), DynamicSpec("y", 0)), dims={"out": 0})
        def two(x, y, out):
            pass
    with pytest.raises(SpecError, match=r"on cut: dims\['out'\] = '0'; expected a dim \(an int\) or \(dim, spec "
                                        r"name\), e.g. dims=\{'out': 0\}"):
        @builds_by_running(BuildConfig(DynamicSpec("x", 0)), dims={"out": "0"})
        def cut(x, out):
            pass
    with pytest.raises(SpecError, match=r"on tied: dims\['out'\] follows 'y.0', which the config does not sweep"):
        @builds_by_running(BuildConfig(DynamicSpec("x", 0)), dims={"out": (0, "y.0")})
        def tied(x, out):
            pass
    for decorator in (lists_kernels, builds_by_running):
        with pytest.raises(TypeError, match=rf"@{decorator.__name__} above bare needs its BuildConfig: "
                                            rf"@{decorator.__name__}\(BuildConfig\(DynamicSpec\('x', dim=0\)\)\)"):
            @decorator
            def bare(x):
                pass
    with pytest.raises(TypeError, match=r"@builds_by_running on plain: expected a BuildConfig"):
        @builds_by_running(DynamicSpec("x", 0))
        def plain(x):
            pass

    @builds_by_running(BuildConfig(DynamicSpec("x", 0)))
    def runner(x):
        pass
    with pytest.raises(TypeError, match="takes no lister"):
        runner.lister(lambda x: [])


def test_one_function_decorated_as_two_ops_fails_at_decoration():
    def impl(x):
        return x

    lists_kernels(BuildConfig(DynamicSpec("x", 0)), name="small")(impl)
    with pytest.raises(TypeError, match="cannot decorate large: its function is already the op small, and an op's "
                                        r"\.lister lives on its function; give each op a function of its own"):
        lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1024])), name="large")(impl)


def test_misuse_at_first_call_names_op_argument_and_dim():
    op = lists_kernels(BuildConfig(DynamicSpec("x", 1)))(lambda x: x)
    with build_pass("warmup"), pytest.raises(SpecError, match=r"<lambda>: DynamicSpec\('x', dim=1\): argument 'x' "
                                                             r"has 1 dimension\(s\), shape \(4,\)"):
        op(torch.empty(4))
    with record_listings() as rec:  # no lister: listed by replay, and this host code launches nothing
        op(torch.empty(4, 4))
    assert rec.keys() == []
    op.lister(lambda x: ["not a build"])
    with build_pass("warmup"), pytest.raises(TypeError, match="the lister of <lambda> returned 'not a build'"):
        op(torch.empty(4, 4))
    op.lister(lambda x: {"float16": []}[str(x.dtype)])  # a lister with a bug: its error, with where it came from
    with build_pass("warmup"), pytest.raises(KeyError) as raised:
        op(torch.empty(4, 4))
    if hasattr(raised.value, "add_note"):
        # at the first size listed: the call's own
        assert raised.value.__notes__ == ["buildops: raised by the lister of op <lambda> at swept dims {'x.1': 4}"]
    # outside a pass a malformed call is the function's own business
    assert op("anything") == "anything"


def test_sixteen_threads_calling_ops_while_builds_run(runs):
    rmsnorm, _ = make_rmsnorm()
    keys = [("k", h) for h in (8, 16, 32, 64)]
    rmsnorm.lister(lambda x, w, eps: [runs.build("rmsnorm", ("k", x.shape[1]), seconds=0.01)])
    errors, barrier = [], threading.Barrier(16)

    def worker(i):
        try:
            barrier.wait(WAIT)
            for j in range(40):
                hidden = 8 << (j % 4)
                x, w = torch.randn(1 + (i + j) % 5, hidden), torch.ones(hidden)
                if j % 10 == 0:
                    with build_pass(f"t{i}"):  # each thread's own pass: every signature lists again
                        for h in (8, 16, 32, 64):
                            y = torch.randn(1 + i, h)
                            assert torch.equal(rmsnorm(y, torch.ones(h)), torch.zeros_like(y))
                else:
                    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
                    assert torch.allclose(rmsnorm(x, w), expected)
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    assert not errors and not any(t.is_alive() for t in threads)
    assert buildops.join(timeout=WAIT)
    assert sorted(runs.calls) == sorted(keys)  # each kernel built once, however many threads listed it
    stats = report().ops[0]
    assert stats.built == 4 and stats.listed == stats.shared + 4 and stats.pending == 0
    assert not rmsnorm._self_op.pending.futures


def test_a_lister_receives_swept_ints_and_keyword_arguments():
    seen = []
    op = lists_kernels(BuildConfig(DynamicSpec("tokens", None, sweep=[16, 32]),
                                   DynamicSpec("x", 0, follows="tokens")), output="x")(lambda x, *, tokens, mode="a": x)
    op.lister(lambda x, *, tokens, mode: seen.append((x.shape, tokens, mode)) or [])
    with record_listings() as rec:
        op(torch.empty(5, 2), tokens=5, mode="b")
    assert seen == [((16, 2), 16, "b"), ((32, 2), 32, "b")]
    assert rec.dims("<lambda>") == [{"tokens": 16, "x.0": 16}, {"tokens": 32, "x.0": 32}]


def test_a_dim_counted_from_the_end_is_swept_like_any_other(runs):
    seen = []

    @builds_by_running(BuildConfig(DynamicSpec("x", dim=-1, sweep=[2, 4])), output="x")
    def last(x):
        seen.append(tuple(x.shape))
        return x

    @lists_kernels(BuildConfig(DynamicSpec("x", dim=-1, sweep=[2, 4])), output="x")
    def listed(x):
        return x

    listed.lister(lambda x: [runs.build("listed", ("listed", x.shape))])
    with build_pass("warmup"):
        last(torch.ones(3, 8))
        listed(torch.ones(3, 8))
    assert sorted(seen) == [(3, 2), (3, 4)] and report().total("failed") == 0
    assert sorted(runs.calls) == [("listed", (3, 2)), ("listed", (3, 4))]


def test_an_op_assigned_into_a_class_is_a_method():
    from buildops.testing import record_listings

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
    def rms_forward(self, x):
        return x * self.scale

    rms_forward.lister(lambda self, x: [])

    class Rms(torch.nn.Module):
        scale = 2.0
        forward = rms_forward

    model = Rms()
    assert torch.equal(model(torch.ones(2, 3)), torch.full((2, 3), 2.0))
    with record_listings() as recorded:
        assert torch.equal(model(torch.ones(2, 3)), torch.zeros(2, 3))
    assert recorded.dims("rms_forward") == [{"x.0": 2}]
    assert torch.equal(rms_forward(model, torch.ones(1, 3)), torch.full((1, 3), 2.0))  # called plainly, too


def test_a_call_outside_a_pass_stops_waiting_for_a_hung_build_at_the_timeout(runs):
    gate = threading.Event()
    rmsnorm, _ = make_rmsnorm(runs, gate=gate)
    x, w = torch.randn(4, 8), torch.ones(8)
    with settings.scope(build_timeout=0.3):
        with rehearsal("startup"):
            rmsnorm(x, w)
        assert runs.started.wait(WAIT)
        out = rmsnorm(x, w)  # waits for the hung build until it is given up, then runs
    assert torch.allclose(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert report().ops[0].failed == 1 and "BUILDOPS_BUILD_TIMEOUT" in report().failures[0][2]
    gate.set()


def test_a_pass_beyond_a_spec_s_max_builds_its_own_shape_too_and_says_so_once(runs, caplog):
    seen = []

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, max=8)), output="x")
    def capped(x):
        return x

    capped.lister(lambda x: seen.append(x.shape[0]) or [runs.build("capped", ("capped", x.shape[0]))])
    with caplog.at_level(logging.WARNING, logger="buildops"), build_pass("warmup"):
        capped(torch.empty(20, 4))
        capped(torch.empty(20, 4))
    assert seen == [20, 1, 2, 4, 8]  # the pass's own shape, first, then the sweep up to max
    assert runs.count(("capped", 20)) == 1 and runs.count(("capped", 8)) == 1
    assert caplog.text.count("beyond its sweep's max") == 1 and "{'x.0': 20}" in caplog.text
    seen.clear()
    with build_pass("again"):
        capped(torch.empty(6, 4))  # within max: the sweep alone, nothing said
    assert seen == [6, 1, 2, 4] and caplog.text.count("beyond its sweep's max") == 1
    rep = report()  # and the report says what the sweeps covered, and the call beyond max
    assert [(s.op, s.dim, s.low, s.high, s.values) for s in rep.swept] == [("capped", "x.0", 1, 20, 6)]
    text = rep.format()
    assert "swept capped: x.0 1..20 (6 values)" in text
    assert "op capped: a pass called it at {'x.0': 20}, beyond its sweep's max {'x.0': 8}; that shape was built too" \
        in text
