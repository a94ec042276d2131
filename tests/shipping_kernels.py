"""Kernels for the shipping tests: a helper module read through an attribute, a constexpr global, a closure."""

import shipping_helpers as helpers
import triton
import triton.language as tl
from triton.language.extra import libdevice

OFFSET = tl.constexpr(2)


@triton.jit
def through_a_module(x, y, BLOCK: tl.constexpr):
    v = tl.load(x + tl.arange(0, BLOCK))
    tl.store(y + tl.arange(0, BLOCK), helpers.twice(v) * helpers.SCALE + OFFSET + libdevice.tanh(v))


def make_closure_kernel(scale):
    """A kernel defined in a function, over a nonlocal constexpr and a nonlocal jit function."""
    factor = tl.constexpr(scale)
    twice = helpers.twice

    @triton.jit
    def scaled(x, y, BLOCK: tl.constexpr):
        tl.store(y + tl.arange(0, BLOCK), twice(tl.load(x + tl.arange(0, BLOCK))) * factor)
    return scaled
