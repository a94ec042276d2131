import inspect

import pytest
import torch

from buildops import BuildConfig, DynamicSpec, SpecError, TensorSpec
from buildops._core.specs import call_signature


def combos(config, fn, **arguments):
    resolved = config.resolve(fn.__name__, list(inspect.signature(fn).parameters.values()))
    return resolved, resolved.combinations(arguments)


def op(x, y=None, n=0):
    pass


@pytest.mark.parametrize("sweep, seen, expected", [
    ("pow2", 100, [1, 2, 4, 8, 16, 32, 64, 100]),
    ("pow2", 64, [1, 2, 4, 8, 16, 32, 64]),
    ("pow2", 1, [1]),
    ("pow2_odd", 100, [1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 100]),
    ("pow2_odd", 2, [1, 2]),
    ("exact", 37, [37]),
    ([1, 2, 3, 129, 256], 5, [1, 2, 3, 129, 256]),   # buckets do not depend on the call's value
    (range(8, 33, 8), 3, [8, 16, 24, 32]),
    (lambda v: [v // 2, v, v], 10, [5, 10]),
])
def test_sweeps(sweep, seen, expected):
    assert DynamicSpec("x", 0, sweep=sweep).values(seen) == expected


def test_max_caps_every_sweep():
    # a call above max builds max in its place: serving's calls up to max need max's bucket (64 here)
    assert DynamicSpec("x", 0, max=50).values(100) == [1, 2, 4, 8, 16, 32, 50]
    assert DynamicSpec("x", 0, sweep="pow2_odd", max=50).values(100) == [1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 50]
    assert DynamicSpec("x", 0, sweep=[16, 512, 1024], max=600).values(1) == [16, 512]  # buckets: only dropped
    assert DynamicSpec("x", 0, sweep=[700, 1024], max=600).values(1) == [600]  # rather than nothing
    assert DynamicSpec("x", 0, sweep="exact", max=64).values(100) == [64]


def test_product_of_specs_ties_and_filter():
    config = BuildConfig(
        DynamicSpec("x", 0, sweep=[1, 2, 4], name="batch"),
        DynamicSpec("y", 1, sweep=[8, 16], name="seq"),
        DynamicSpec("y", 0, follows="batch"),
        DynamicSpec("n", None, follows=lambda d: d["batch"] * d["seq"]),
        where=lambda d: d["seq"] >= 4 * d["batch"],
    )
    _, result = combos(config, op, x=torch.empty(4, 3), y=torch.empty(4, 16), n=64)
    assert result == [
        {"batch": 1, "seq": 8, "y.0": 1, "n": 8},
        {"batch": 1, "seq": 16, "y.0": 1, "n": 16},
        {"batch": 2, "seq": 8, "y.0": 2, "n": 16},
        {"batch": 2, "seq": 16, "y.0": 2, "n": 32},
        {"batch": 4, "seq": 16, "y.0": 4, "n": 64},
    ]


def test_cap_on_combinations():
    config = BuildConfig(DynamicSpec("x", 0, sweep=range(100)), DynamicSpec("y", 0, sweep=range(100)),
                         max_combinations=1000)
    with pytest.raises(SpecError, match=r"op: the sweep of \['x.0', 'y.0'\] gives more than max_combinations=1000"):
        combos(config, op, x=torch.empty(2), y=torch.empty(2))


@pytest.mark.parametrize("make, message", [
    (lambda: DynamicSpec("x", 0, sweep="linear"), "unknown sweep 'linear'"),
    (lambda: DynamicSpec("x", 0, sweep=[1, -2]), r"sweep buckets must be .* got \[-2\]"),
    (lambda: DynamicSpec("x", 0, max=0), "max must be an int >= 1"),
    (lambda: DynamicSpec("x", 0, sweep=5), "sweep must be one of .* got 5"),
    (lambda: DynamicSpec("x", 0, sweep=None), "sweep must be one of .* got None"),
    (lambda: BuildConfig(DynamicSpec("x", 0), where=5), "where= must be a callable of the swept dims"),
    (lambda: DynamicSpec("x", "0"), "dim must be an int"),
    (lambda: DynamicSpec(-1, 0), "a position must be >= 0"),
    (lambda: BuildConfig(), "at least one DynamicSpec"),
    (lambda: BuildConfig(DynamicSpec("x", 0), DynamicSpec("x", 0)), "two specs are named 'x.0'"),
    (lambda: BuildConfig(DynamicSpec("x", 0), DynamicSpec("y", 0, follows="z")), "follows 'z', which is not"),
    (lambda: BuildConfig(DynamicSpec("x", 0), max_combinations=0), "max_combinations must be"),
])
def test_bad_specs_fail_when_made(make, message):
    with pytest.raises(SpecError, match=message):
        make()


def test_bad_specs_fail_against_the_op():
    params = list(inspect.signature(op).parameters.values())
    with pytest.raises(SpecError, match=r"op: DynamicSpec\('z', dim=0\) names no argument of op; its arguments are"):
        BuildConfig(DynamicSpec("z", 0)).resolve("op", params)
    with pytest.raises(SpecError, match="refers to positional argument 3, but op takes 3"):
        BuildConfig(DynamicSpec(3, 0)).resolve("op", params)
    with pytest.raises(SpecError, match="argument 'x' dim 0 is named by two specs"):
        BuildConfig(DynamicSpec("x", 0), DynamicSpec(0, 0, name="again")).resolve("op", params)


def test_bad_calls_name_op_argument_and_dim():
    config = BuildConfig(DynamicSpec("x", 2))
    message = r"op: DynamicSpec\('x', dim=2\): argument 'x' has 2 dimension\(s\), shape \(4, 3\)"
    with pytest.raises(SpecError, match=message):
        combos(config, op, x=torch.empty(4, 3))
    with pytest.raises(SpecError, match=r"expects argument 'x' to be a tensor, got float"):
        combos(config, op, x=1.5)
    with pytest.raises(SpecError, match=r"expects argument 'n' to be an int, got str"):
        combos(BuildConfig(DynamicSpec("n", None)), op, x=None, n="3")


def test_call_signature_ignores_swept_dims_only():
    swept = {"x": {0}}
    base = call_signature({"x": torch.empty(8, 4), "eps": 1e-6}, swept)
    assert call_signature({"x": torch.empty(3, 4), "eps": 1e-6}, swept) == base
    assert call_signature({"x": torch.empty(8, 5), "eps": 1e-6}, swept) != base          # unswept dim
    assert call_signature({"x": torch.empty(8, 4, dtype=torch.half), "eps": 1e-6}, swept) != base  # dtype
    assert call_signature({"x": torch.empty(8, 4, 1), "eps": 1e-6}, swept) != base       # rank
    assert call_signature({"x": torch.empty(8, 4), "eps": 1e-5}, swept) != base          # static arg
    assert call_signature({"x": torch.empty(4, 8).t(), "eps": 1e-6}, swept) != base      # layout


def test_tensor_spec_describes_without_memory():
    spec = TensorSpec.like(torch.empty(8, 4, 2, dtype=torch.float16), {0: 32})
    assert spec.shape == (32, 4, 2) and spec.dtype == torch.float16 and spec.device.type == "cpu"
    assert (spec.ndim, spec.dim(), spec.size(1), spec.numel(), spec.stride()) == (3, 3, 4, 256, (8, 2, 1))
    assert spec.element_size() == 2 and spec.size() == torch.Size([32, 4, 2])
    assert spec.meta().device.type == "meta"
