"""An op over FlashInfer's ``silu_and_mul`` that lists the activation's JIT module: the op of the FlashInfer tests
that run in this process and of those that run it as a node of its own. Import it once FlashInfer's settings are in
the environment: FlashInfer reads them at its import."""

import flashinfer.activation
from flashinfer.jit.activation import gen_act_and_mul_module

from buildops import BuildConfig, DynamicSpec, lists_kernels
from buildops.backends.flashinfer import module_builds


@lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
def silu_and_mul(x):
    return flashinfer.activation.silu_and_mul(x)


@silu_and_mul.lister
def _(x):
    return module_builds("silu_and_mul", [gen_act_and_mul_module("silu")])
