"""Reproduce exactly the in-memory cache key JITFunction.run() looks up in kernel.device_caches[device].

Mirrors triton/runtime/jit.py JITFunction.run (3.7.1 lines 708-728; 3.6.0 same minus the
add_stages_inspection_hook branch):
    kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kernel_cache, kernel_key_cache, target, backend, binder = self.device_caches[device]
    bound_args, specialization, options = binder(*args, **kwargs)
    key = compute_cache_key(kernel_key_cache, specialization, options)
"""
import triton
from triton import knobs
from triton.runtime.jit import JITFunction, MockTensor, compute_cache_key
from triton.runtime.driver import driver


import inspect as _inspect
_RUN_USES_STAGES_HOOK = "add_stages_inspection_hook" in _inspect.getsource(JITFunction.run)


def unwrap_jit(fn):
    """Autotuner/Heuristics -> innermost JITFunction."""
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn


def specialization_of(kernel, *args, warmup=True, **kwargs):
    kernel = unwrap_jit(kernel)
    if warmup:   # KernelInterface.warmup wraps torch dtypes in MockTensor (data_ptr()==0 -> "D")
        args = tuple(map(MockTensor.wrap_dtype, args))
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    device = driver.active.get_current_device()
    _, _, _, _, binder = kernel.device_caches[device]   # defaultdict -> create_binder() on first use
    bound_args, specialization, options = binder(*args, **kwargs)
    hook = getattr(knobs.runtime, "add_stages_inspection_hook", None)
    if hook is not None and _RUN_USES_STAGES_HOOK:     # 3.7.1 only (jit.py:722-724)
        _, h = hook()
        specialization.append(f'("custom_pipeline", {h})')
    return bound_args, specialization, options


def launch_key(kernel, *args, warmup=True, **kwargs):
    """The string key of kernel.device_caches[device][0] (kernel_cache) for this launch."""
    _, spec, opts = specialization_of(kernel, *args, warmup=warmup, **kwargs)
    return compute_cache_key({}, spec, opts)   # fresh memo dict: same result, no side effects


def is_cached(kernel, *args, **kwargs):
    kernel = unwrap_jit(kernel)
    kernel_cache = kernel.device_caches[driver.active.get_current_device()][0]
    return launch_key(kernel, *args, **kwargs) in kernel_cache
