"""Call signatures: split wherever Triton compiles apart, shared by equal layers, static= arguments left out, and
read by tests as `Signature`s."""

import itertools
import threading

import pytest
import torch
from torch import nn

from buildops import BuildConfig, DynamicSpec, SpecError, build_pass, builds_by_running, join, lists_kernels
from buildops._core.signatures import call_signature, static_key
from buildops.testing import ModuleSignature, Signature, TensorSignature, record_listings

from conftest import WAIT

try:
    import triton
    import triton.language as tl
except ImportError:  # the Triton tests skip; the rest need no Triton
    triton = None

needs_triton = pytest.mark.skipif(triton is None, reason="needs Triton")

# The grid, and a few more: each value once, Python-equal ones (1, 1.0, True) of different types included
GRID = [0, 1, 2, 15, 16, 17, 32, 48, 2**31 - 1, 2**31, 2**40, -16, 1.0, 2.0, 0.5, True, False, None]


def signature(**arguments):
    return call_signature(arguments, {})


if triton is not None:
    @triton.jit
    def _scalar_kernel(a):
        pass

    @triton.jit
    def _scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * alpha, mask=offsets < n)

    @triton.jit
    def _attend_kernel(q_ptr, out_ptr, n, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        q = tl.load(q_ptr + offsets, mask=offsets < n)
        if CAUSAL:
            q = q * 2
        tl.store(out_ptr + offsets, q, mask=offsets < n)

    @triton.jit
    def _rms_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        row = tl.program_id(0)
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
        tl.store(out_ptr + row * n_cols + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name="scale")
    def scale(x, alpha):
        out = torch.empty_like(x)
        _scale_kernel[(1,)](x, out, x.numel(), alpha, BLOCK=64)
        return out

    @lists_kernels(BuildConfig(DynamicSpec("q", 0, sweep="exact")), output="q", name="attend")
    def attend(q, causal, n):
        """Host code the way attention ops are written: a bool becomes a flag, an int a block size."""
        out = torch.empty_like(q)
        _attend_kernel[(q.shape[0],)](q, out, n, CAUSAL=causal, BLOCK=triton.next_power_of_2(n))
        return out


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-6, dtype=torch.float16):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))
        self.eps = eps

    @lists_kernels(BuildConfig(DynamicSpec("x", 0)), output="x", name="rms")
    def forward(self, x):
        out = torch.empty_like(x)
        _rms_kernel[(x.shape[0],)](x, self.weight, out, x.shape[1], self.eps, BLOCK=triton.next_power_of_2(x.shape[1]))
        return out


@pytest.fixture
def binder():
    """Triton's own binder for a kernel of one argument: what it specializes a value to."""
    pytest.importorskip("buildops.backends.triton").target()  # a driver, so that the binder has a backend
    make = _scalar_kernel.create_binder()[4]
    return lambda value: make(value)[1][0]


# -- point 4: signatures split wherever Triton specializes apart -------------------------------------------------

@needs_triton
def test_values_triton_specializes_apart_never_share_a_signature(binder):
    for a, b in itertools.product(GRID, repeat=2):
        if binder(a) != binder(b):
            assert signature(a=a) != signature(a=b), (a, b)
        # finer than Triton by design: a value and its type, since host code may branch on either
        assert (signature(a=a) == signature(a=b)) == ((type(a), a) == (type(b), b)), (a, b)
    assert signature(a=int("16")) == signature(a=16) and signature(a=float("2")) == signature(a=2.0)
    assert binder(1) != binder(1.0) != binder(True) != binder(2)  # the four variants


def test_python_equal_scalars_of_other_types_are_other_signatures():
    keys = {signature(alpha=v) for v in (1, 1.0, True, 2, 2.0)}
    assert len(keys) == 5  # each its own: 1 == 1.0 == True in Python, not to Triton
    assert signature(block=(1, 2)) != signature(block=(True, 2)) != signature(block=[1, 2])
    assert signature(cfg={"n": 1}) != signature(cfg={"n": True})
    assert signature(eps=float("nan")) == signature(eps=float("nan"))  # NaN equals nothing, but is one signature


@needs_triton
def test_every_variant_triton_compiles_for_a_scalar_is_listed(binder):
    x = torch.empty(8)
    with record_listings() as rec:
        for alpha in (1, 1.0, True, 2, 2.0):
            scale(x, alpha)
    assert len(set(rec.keys("scale"))) == len({binder(v) for v in (1, 1.0, True, 2, 2.0)}) == 4


@needs_triton
def test_values_triton_treats_alike_as_arguments_can_still_compile_apart(binder):
    # As arguments of the op, True and False are both 'u1', and 32 and 48 are both 'i32' divisible by 16: under
    # Triton's rule for kernel arguments they would share one signature. The host code makes three kernels of them.
    assert binder(True) == binder(False) and binder(32) == binder(48)
    q = torch.empty(4, 64)
    with record_listings() as rec:
        for causal, n in ((True, 32), (False, 32), (True, 48)):
            attend(q, causal, n)
    assert len(rec.signatures("attend")) == 3 and len(set(rec.keys("attend"))) == 3


@needs_triton
def test_an_unaligned_tensor_is_another_signature_and_its_variant_is_listed():
    buffer = torch.zeros(17, dtype=torch.float16)
    aligned, unaligned = buffer[:16], buffer[1:]  # 2 bytes in: not a multiple of 16
    assert signature(w=aligned) != signature(w=unaligned)
    assert signature(w=aligned) == signature(w=torch.zeros(16, dtype=torch.float16))
    x = torch.empty(2, 16, dtype=torch.float16)
    with record_listings() as rec:
        RMSNorm(16).forward(x)
        norm = RMSNorm(16)
        norm.weight = nn.Parameter(unaligned)
        norm.forward(x)
    assert [s["self"]["weight"].aligned for s in rec.signatures("rms")] == [True, False]
    by_signature: dict = {}
    for listing in rec.of("rms"):
        by_signature.setdefault(listing.signature, set()).update(listing.keys)
    aligned_keys, unaligned_keys = by_signature.values()
    assert aligned_keys.isdisjoint(unaligned_keys)


def test_meta_and_fake_tensors_are_aligned_as_their_offset_says():
    from torch._subclasses.fake_tensor import FakeTensorMode

    meta = torch.empty(17, dtype=torch.float16, device="meta")
    assert signature(w=meta[1:])[0][1][-1] is False and signature(w=meta[8:])[0][1][-1] is True
    with FakeTensorMode() as mode:
        fake = torch.empty(17, dtype=torch.float16)
    assert mode is not None and signature(w=fake[1:])[0][1][-1] is False


# -- point 5: equal layers share a signature ---------------------------------------------------------------------

@needs_triton
def test_sixty_four_equal_layers_list_once_per_swept_shape():
    layers = nn.ModuleList(RMSNorm(64) for _ in range(64))
    x = torch.empty(100, 64, dtype=torch.float16)
    with record_listings() as rec:
        for layer in layers:
            x = layer(x)
    assert [d["x.0"] for d in rec.dims("rms")] == [1, 2, 4, 8, 16, 32, 64, 100]  # once, not 64 times
    assert rec.signatures("rms") == [Signature(self=ModuleSignature(RMSNorm, weight=("float16", "cpu", (64,)),
                                                                    eps=1e-6),
                                               x=("float16", "cpu", (None, 64)))]
    assert rec.signatures("rms") == [Signature(self=RMSNorm, x=("float16", "cpu", (None, 64)))]


@needs_triton
def test_layers_whose_compile_state_differs_list_apart():
    x = torch.empty(8, 64, dtype=torch.float16)
    with record_listings() as rec:
        RMSNorm(64)(x)
        RMSNorm(64, eps=1e-5)(x)                                    # a plain attribute
        RMSNorm(64, dtype=torch.float32)(x)                         # a parameter's dtype
        RMSNorm(32)(torch.empty(8, 32, dtype=torch.float16))        # a parameter's shape
        RMSNorm(64).train(False)(x)                                 # training
        RMSNorm(64).to("meta")(x)                                   # a parameter's device
        RMSNorm(64)(x)                                              # like the first
    assert len(rec.signatures("rms")) == 6


def test_a_module_is_keyed_by_class_parameters_buffers_attributes_and_submodules():
    class Block(nn.Module):
        def __init__(self, heads=4, helper=None):
            super().__init__()
            self.heads, self.helper, self.names = heads, helper, ("q", "k")
            self.proj = nn.Linear(8, 8)
            self.register_buffer("cache", torch.zeros(2, 8))

    assert static_key(Block()) == static_key(Block())
    assert static_key(Block(heads=8)) != static_key(Block())
    shared = object()  # an attribute keyed by identity: equal only where the layers hold the same object
    assert static_key(Block(helper=shared)) == static_key(Block(helper=shared))
    assert static_key(Block(helper=[object()])) != static_key(Block(helper=[object()]))
    wider = Block()
    wider.proj = nn.Linear(8, 16)
    assert static_key(wider) != static_key(Block())
    class Other(Block):
        pass
    assert static_key(Other()) != static_key(Block())
    looped = Block()
    looped.proj.parent = looped  # a module that holds its ancestor: keyed without recursing forever
    assert static_key(looped) == static_key(looped)
    grown = Block()
    key = static_key(grown)
    grown.cache = torch.zeros(4, 8)  # keys are computed per call: a change shows at once
    assert static_key(grown) != key


# -- point 8: static= --------------------------------------------------------------------------------------------

def test_builds_by_running_leaves_static_arguments_out_of_the_signature():
    ran, lock = [], threading.Lock()

    @builds_by_running(BuildConfig(DynamicSpec("x", 0, sweep=[2, 8])), static=("alpha",), output="x")
    def axpy(x, y, alpha):
        with lock:
            ran.append((x.shape[0], alpha))
        return x * alpha + y

    y = torch.ones(3)
    with record_listings() as rec:
        axpy(torch.ones(4, 3), y, 2.0)
        axpy(torch.ones(4, 3), y, 3.0)
    assert rec.signatures("axpy") == [Signature(x=("float32", "cpu", (None, 3)), y=("float32", "cpu", (3,)))]
    with build_pass("warmup"):
        axpy(torch.ones(4, 3), y, 2.0)
        axpy(torch.ones(5, 3), y, 3.0)  # one set of runs, with the first call's alpha
    assert join(timeout=WAIT) and sorted(ran) == [(2, 2.0), (8, 2.0)]


def test_static_names_are_checked_when_the_op_is_decorated():
    config = BuildConfig(DynamicSpec("x", 0))
    with pytest.raises(SpecError, match=r"axpy: static= names 'beta', which is not a parameter of axpy; its "
                                        r"parameters are \['x', 'out', 'alpha'\]"):
        @builds_by_running(config, static=("beta",))
        def axpy(x, out, alpha):
            pass
    with pytest.raises(SpecError, match=r"axpy: static= names 'x', but 'x' is swept \(spec 'x.0'\)"):
        @builds_by_running(config, static="x")
        def axpy(x, out, alpha):
            pass
    with pytest.raises(SpecError, match=r"axpy: static= names 'out', but 'out' is swept"):
        @builds_by_running(config, dims={"out": 0}, static=("alpha", "out"))
        def axpy(x, out, alpha):
            pass
    with pytest.raises(SpecError, match=r"@builds_by_running on axpy: static= takes argument names, got \[3\]"):
        @builds_by_running(config, static=(3,))
        def axpy(x, out, alpha):
            pass


def test_a_listed_op_takes_static_names_through_its_config():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")).with_static("eps"), output="x")
    def norm(x, eps):
        return x

    norm.lister(lambda x, eps: [])
    with record_listings() as rec:
        norm(torch.ones(2, 4), 1e-5)
        norm(torch.ones(2, 4), 1e-6)
    assert rec.signatures("norm") == [{"x": ("float32", "cpu", (None, 4))}]


# -- point 10: readable signatures -------------------------------------------------------------------------------

def test_a_signature_reads_like_the_call_and_equals_what_a_test_writes():
    @lists_kernels(BuildConfig(DynamicSpec("x", 0), DynamicSpec("n", None)), output="x")
    def mix(x, w, n, causal, eps=1e-6, block=(64, 32), act="silu"):
        return x

    mix.lister(lambda *a: [])
    w = torch.zeros(8, 4).t()
    with record_listings() as rec:
        mix(torch.zeros(5, 4, dtype=torch.bfloat16), w, 5, True)
    [sig] = rec.signatures("mix")
    assert repr(sig) == ("Signature(x=('bfloat16', 'cpu', (None, 4)), w=('float32', 'cpu', (4, 8), False), n=None, "
                         "causal=True, eps=1e-06, block=(64, 32), act='silu')")
    assert eval(repr(sig)) == sig  # a failing assertion's repr can be pasted into the test
    assert sig == {"x": (torch.bfloat16, "cpu", [None, 4]), "w": ("float32", torch.device("cpu"), (4, 8), False),
                   "n": None, "causal": True, "eps": 1e-6, "block": (64, 32), "act": "silu"}
    assert sig["x"].dtype == "bfloat16" and sig["x"].shape == (None, 4) and sig["w"].contiguous is False
    assert sig["x"] == TensorSignature("bfloat16", "cpu", (None, 4)) == ("bfloat16", "cpu", (None, 4), True, True)
    assert TensorSignature(torch.float16, "cuda:1", [8]) == ("float16", torch.device("cuda", 0), (8,))
    assert sig != {**sig, "causal": 1}          # True is not 1: they are different signatures
    assert sig != {**sig, "eps": 1}             # nor is 1 the float 1.0
    assert sig != {**sig, "x": ("bfloat16", "cpu", (5, 4))}  # a swept dim is None
    assert sig != {**sig, "w": ("float32", "cpu", (4, 8))}   # left out, contiguous means True
    assert sig != {k: v for k, v in sig.items() if k != "act"}


def test_module_signatures_read_as_class_and_state():
    assert list(Signature(self=None)) == ["self"]  # a Signature may have an argument named self
    key = ModuleSignature(nn.Linear, weight=("float32", "cpu", (4, 2)), bias=("float32", "cpu", (4,)), in_features=2,
                          out_features=4)
    assert repr(key) == ("ModuleSignature(Linear, weight=('float32', 'cpu', (4, 2)), bias=('float32', 'cpu', (4,)), "
                         "in_features=2, out_features=4)")
    from buildops._core.signatures import readable

    recorded = readable(call_signature({"self": nn.Linear(2, 4)}, {}))["self"]
    assert recorded == key and recorded == nn.Linear and recorded != nn.Conv1d
    assert recorded != ModuleSignature(nn.Linear, **{**key.state, "training": False})


def test_a_family_keeps_the_signature_it_gave():
    from buildops._core.signatures import readable

    assert readable(("model_configured", 32)) == ("model_configured", 32)
