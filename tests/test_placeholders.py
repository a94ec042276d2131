"""Placeholders without code: an op decorated without ``output=`` returns, inside a pass, the structure its host code
returns on stand-in tensors at the call's own shapes, with zeros for its tensors. Methods are recognised by how
they are bound."""

import collections

import pytest
import torch

pytest.importorskip("triton")

import triton
import triton.language as tl

from buildops import BuildConfig, DynamicSpec, SpecError, build_pass, lists_kernels
from buildops.testing import record_listings

ROWS = BuildConfig(DynamicSpec("x", 0, sweep=[1, 16]))
Pair = collections.namedtuple("Pair", "out scale")


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


runs = []


def third_party_gemm(x, w):
    """A function written elsewhere, decorated from outside: a tuple of a new tensor, a view of it, a view of its
    input and an int."""
    runs.append(tuple(x.shape))
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
    return out, out.t(), x[:, :4], x.shape[0]


gemm = lists_kernels(ROWS)(third_party_gemm)


def test_a_tuple_of_tensors_views_and_an_int():
    x, w = torch.ones(40, 8), torch.ones(8, 24)
    runs.clear()
    with record_listings() as rec:
        out, transposed, head, rows = gemm(x, w)
    assert len(rec.keys("third_party_gemm")) == 2
    assert runs == [(1, 8), (16, 8), (40, 8)]  # a replay per swept shape, then one at the call's own shapes
    assert (out.shape, out.dtype, out.device.type) == ((40, 24), torch.float32, "cpu")
    assert out.count_nonzero() == 0 and out.is_contiguous()
    assert transposed.shape == (24, 40) and transposed.stride() == (1, 24)  # a permutation keeps its strides
    assert head.shape == (40, 4) and head.count_nonzero() == 0
    assert rows == 40  # other values as returned, at the call's own shapes
    assert head.data_ptr() != x.data_ptr()  # new zeros, never the caller's own tensors


def test_later_calls_reuse_the_inferred_structure_and_get_fresh_zeros():
    x, w = torch.ones(30, 8), torch.ones(8, 24)
    runs.clear()
    with build_pass("warmup"):
        first = gemm(x, w)
        first[0].fill_(1)
        second = gemm(x, w)
        third = gemm(torch.ones(5, 8), w)  # same call signature, other rows: a structure of its own
    # the sweep's first shape in the body (the call's own is not swept), the placeholders' replays, then the rest
    # of the sweep at the pass's end
    assert runs == [(1, 8), (30, 8), (5, 8), (16, 8)]
    assert second[0].count_nonzero() == 0 and second[0] is not first[0]
    assert third[0].shape == (5, 24) and third[3] == 5


def test_containers_are_rebuilt_with_their_types():
    @lists_kernels(ROWS)
    def structured(x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        return {"pair": Pair(out, 2.0), "list": [out[0], None, "label"]}

    with record_listings():
        result = structured(torch.ones(40, 8))
    assert isinstance(result["pair"], Pair) and result["pair"].scale == 2.0
    assert result["pair"].out.shape == (40, 8) and result["pair"].out.count_nonzero() == 0
    assert result["list"][0].shape == (8,) and result["list"][1:] == [None, "label"]


def test_a_view_into_a_much_larger_tensor_is_contiguous_zeros():
    @lists_kernels(ROWS)
    def window(x, cache):
        copy_kernel[(1,)](x, cache, x.numel(), BLOCK=1024)
        return cache[:, :4]

    cache = torch.ones(40, 4096)
    with record_listings():
        view = window(torch.ones(40, 8), cache)
    assert view.shape == (40, 4) and view.is_contiguous() and view.count_nonzero() == 0


def test_meta_arguments_get_a_meta_placeholder():
    x = torch.empty(40, 8, device="meta")
    with record_listings():
        out, *_ = gemm(x, torch.empty(8, 24, device="meta"))
    assert out.device.type == "meta" and out.shape == (40, 24)


def test_an_op_with_a_lister_and_no_output_says_what_to_pass():
    @lists_kernels(ROWS)
    def listed_without_output(x):
        return x

    listed_without_output.lister(lambda x: [])
    with record_listings(), pytest.raises(SpecError, match=r"listed_without_output returns nothing buildops can "
                                                           r"infer inside a pass: it has a lister, .* Pass "
                                                           r"output= to @lists_kernels"):
        listed_without_output(torch.ones(4, 2))

    @lists_kernels(ROWS, output=None)
    def in_place(x):
        x.mul_(2)

    in_place.lister(lambda x: [])
    with record_listings():
        assert in_place(torch.ones(4, 2)) is None  # output=None: an op that returns nothing


def test_host_code_that_cannot_be_replayed_at_the_calls_shape_says_so():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep=[1])))
    def peeks(x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        if x.shape[0] > 1:
            return out[: int(x.sum().item())]  # needs data, at the call's own shape only
        return out

    with record_listings(), pytest.raises(SpecError, match=r"replay of peeks to infer its placeholder output "
                                                           r"failed: .*pass output= to the decorator of peeks"):
        peeks(torch.ones(4, 2))


class Scaled(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    @lists_kernels(BuildConfig(DynamicSpec(0, 0, sweep="exact")))  # position 0: the call's first argument
    def forward(this, x):  # the instance by another name: recognised by how the op is bound
        return x * this.scale


def _plain_forward(module, x):
    return x * module.scale


def test_methods_are_recognised_by_how_they_are_bound():
    model = Scaled(3.0)
    assert torch.equal(model(torch.ones(2, 2)), torch.full((2, 2), 3.0))
    with record_listings() as rec:
        assert torch.equal(model(torch.ones(5, 2)), torch.zeros(5, 2))
    assert rec.dims("Scaled.forward") == [{"0.0": 5}]

    forward = lists_kernels(BuildConfig(DynamicSpec(0, 0, sweep="exact")), output=lambda m, x: x * 0)(
        _plain_forward)
    forward.lister(lambda module, x: [])

    class Assigned(torch.nn.Module):  # a function put into a class: its first parameter is the instance
        scale = 2.0

    Assigned.forward = forward
    with record_listings() as rec:
        Assigned()(torch.ones(3, 2))
    assert rec.dims("_plain_forward") == [{"0.0": 3}]  # position 0 is x, after the instance (a module has no dim)


def test_a_dataclass_result_is_rebuilt_field_by_field_with_fresh_zeros():
    import dataclasses

    @dataclasses.dataclass
    class Out:
        hidden: torch.Tensor
        lse: torch.Tensor
        steps: int

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")))
    def attend(x):
        return Out(x * 2, x.sum(-1), 3)

    x = torch.ones(4, 8)
    with record_listings():
        first, second = attend(x), attend(x)
    assert first is not second and first.hidden is not second.hidden
    assert first.hidden.device == x.device and first.hidden.shape == (4, 8) and not first.hidden.any()
    assert first.lse.shape == (4,) and first.steps == 3


def test_an_object_holding_tensors_it_cannot_rebuild_asks_for_output():
    class Out:
        def __init__(self, hidden):
            self.hidden = hidden

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")))
    def opaque(x):
        return Out(x * 2)

    with pytest.raises(SpecError, match=r"opaque returns .*Out, which holds tensors .* give the op output="):
        with record_listings():
            opaque(torch.ones(4, 8))
