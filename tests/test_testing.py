import torch

from buildops import Build, BuildConfig, DynamicSpec, lists_kernels
from buildops._core.default import current_builder
from buildops.testing import record_listings


@lists_kernels(BuildConfig(DynamicSpec("x", 0, max=64)), output="x")
def softmax(x):
    return torch.softmax(x, -1)


@softmax.lister
def _(x):
    block = 1 << (x.shape[-1] - 1).bit_length()
    return [Build("softmax", ("softmax", x.dtype, block, x.shape[0] >= 32), lambda: None)]


def test_recorder_captures_listings_without_building():
    with record_listings() as rec:
        out = softmax(torch.randn(100, 48))
        softmax(torch.randn(7, 48))                       # same signature
        softmax(torch.randn(3, 48, dtype=torch.float16))  # new signature
    assert torch.equal(out, torch.zeros(100, 48))
    name = softmax.op_name  # "softmax", or "test_testing.softmax" where another module's softmax has that name
    assert rec.ops() == [name]
    assert len(rec.signatures(name)) == 2
    # up to max=64, and the call's own 100 rows, beyond it: a pass at a shape serving was said never to reach
    assert [d["x.0"] for d in rec.dims(name)] == [1, 2, 4, 8, 16, 32, 64, 100, 1, 2, 3]
    assert rec.keys(name)[:1] == [("softmax", torch.float32, 64, False)]
    assert set(rec.keys()) == {("softmax", dt, 64, big) for dt in (torch.float32, torch.float16)
                               for big in (False, True)} - {("softmax", torch.float16, 64, True)}
    assert current_builder() is None  # nothing was queued, no worker started


def test_a_recorder_inside_a_real_pass_sees_every_call_and_queues_nothing_for_it():
    import buildops
    from buildops import build_pass

    built = []

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
    def norm(x):
        return x

    norm.lister(lambda x: [Build("norm", ("norm", x.shape[1]), lambda: built.append(x.shape[1]))])
    with build_pass("warmup"):
        norm(torch.empty(4, 3))
        with record_listings() as rec:
            norm(torch.empty(4, 3))  # the pass listed it already: the recorder still sees the call
            norm(torch.empty(4, 5))
        norm(torch.empty(4, 5))  # the recorder's listing did not count as the pass's own
    assert rec.keys("norm") == [("norm", 3), ("norm", 5)]
    assert buildops.join(timeout=10) and sorted(built) == [3, 5]
