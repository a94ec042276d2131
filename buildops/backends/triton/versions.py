"""Triton's internals that buildops reads, version by version, kept here so that a new Triton changes one place.
Checked against 3.6, 3.7.1, 3.8 and 3.9 (pyproject.toml's bounds; CI runs the suite on the oldest and the newest).

* How ``JITFunction.run`` finds a launch's compiled kernel (a build's key depends on it). 3.6 keys a launch on its
  specialization and its options (``debug``, ``instrumentation_mode`` and the caller's); 3.7 adds the pipeline of a
  stages inspection hook, where one is set; 3.9 adds the option ``fpsan_homomorphic_casts``. In every one the
  binder that specializes a launch is the fifth item of the function's cache for the device.
* How ``Autotuner.run`` files a choice: under the key arguments' values, then the dtypes of the arguments that have
  one, in its ``cache`` dict (the same from 3.6 to 3.9).
* How a compiled kernel is loaded: its launcher made by the active driver's ``launcher_cls`` from its source and
  metadata, then ``_init_handles``; and the install's hash, ``triton.runtime.cache.triton_key``.
* What goes into a compiled variant's identity besides its source: the backend compiler's ``hash()`` for a target
  and the environment variables Triton's own cache key reads.
* The disk cache's layout (the same from 3.6 to 3.9): one directory per variant, named by its hash (or the hash in
  base32); in it each stage's file, the metadata ``<name>.json`` and last the group file ``__grp__<name>.json``
  whose ``child_paths`` name every file by absolute path.
* Where kernels of other kinds live: ``ConstexprFunction`` (3.8+), the interpreter's ``InterpretedFunction``, the
  CUDA helper module (``CudaUtils``); and that a pointer argument specializes on 16-byte alignment.

Imports Triton, never torch: worker processes import it.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import triton
from triton import knobs
from triton.runtime.jit import JITFunction, compute_cache_key

__all__ = ["BINARY_EXTENSIONS", "GROUP_PREFIX", "INTERPRETER_MODULE", "POINTER_ALIGNMENT", "VERSION",
           "build_cuda_utils", "cache_invalidating_env", "compiler_hash", "constexpr_function_type", "entry_names",
           "launch_key", "launch_specialization", "launcher_signature", "load", "make_launcher", "triton_key",
           "tuning_choices", "tuning_key"]


def _minor(text: str) -> tuple[int, int]:
    major, minor = (int(part) for part in re.findall(r"\d+", text)[:2])
    return major, minor


VERSION = _minor(triton.__version__)


def launch_specialization(jit: JITFunction, device: int, args: tuple, kwargs: dict) -> tuple[list, dict[str, Any]]:
    """The launch's specialization and options as ``JITFunction.run`` computes them: one ``(type, spec)`` per
    kernel parameter, e.g. ``("*fp16", "D")``, ``("i32", "D")``, ``("constexpr", 1)``."""
    options = dict(kwargs)
    options["debug"] = options.get("debug", jit.debug) or knobs.runtime.debug
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if VERSION >= (3, 9):
        options["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binder = jit.device_caches[device][4]
    _, specialization, options = binder(*args, **options)
    return list(specialization), options


def launch_key(specialization: list, options: dict[str, Any]) -> str:
    """The key ``JITFunction.run`` looks the launch up under."""
    specialization = list(specialization)
    hook: Any = knobs.runtime.add_stages_inspection_hook if VERSION >= (3, 7) else None
    if hook is not None:  # called with no arguments, as run() does (its declared type has the compiler's call)
        specialization.append(f'("custom_pipeline", {hook()[1]})')
    return compute_cache_key({}, specialization, options)


def tuning_key(tuner: Any, args: tuple, kwargs: dict) -> tuple:
    """The key ``Autotuner.run`` files its choice under: the key arguments, then the dtypes of those that have one."""
    named = {k: v for k, v in {**dict(zip(tuner.arg_names, args)), **kwargs}.items() if k in tuner.arg_names}
    return tuple([named[k] for k in tuner.keys if k in named] +
                 [str(v.dtype) for v in named.values() if hasattr(v, "dtype")])


def tuning_choices(tuner: Any) -> dict | None:
    """The tuner's chosen configs by tuning key (its memory, which ``run`` reads first), or None for a tuner that
    keeps none."""
    choices = getattr(tuner, "cache", None)
    return choices if isinstance(choices, dict) else None


def make_launcher(kernel: Any) -> None:
    """Make the compiled kernel's launcher, as its load will (a C module per signature up to 3.6; cached)."""
    from .driver import active_driver  # here: the driver module imports torch

    active_driver().launcher_cls(kernel.src, kernel.metadata)


def launcher_signature(kernel: Any) -> str:
    """What a launcher's C source depends on: the scalar types, which arguments are pointers (whatever they point
    to), and whether each tensor descriptor has metadata; not the constants that tell one variant from another."""
    def kind(arg_type: Any) -> Any:
        if isinstance(arg_type, tuple):
            return tuple(kind(t) for t in arg_type)
        return "*" if isinstance(arg_type, str) and arg_type.startswith("*") else arg_type
    signature = getattr(getattr(kernel, "src", None), "signature", None) or {}
    descriptors = getattr(kernel.metadata, "tensordesc_meta", None)
    return repr((tuple(kind(t) for t in signature.values()),
                 None if descriptors is None else tuple(m is None for m in descriptors)))


def load(kernel: Any) -> None:
    """Load the compiled kernel onto the current GPU (its module, function and launcher)."""
    kernel._init_handles()


try:
    from triton.runtime.cache import triton_key
except ImportError:  # moved in another Triton version: each process computes it once, perhaps on several threads
    def triton_key() -> str:
        return ""


def compiler_hash(backend: str, arch: Any, warp_size: int) -> str:
    """The backend compiler's hash for a target (ptxas's version and the arch, for CUDA)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget(backend, arch, warp_size)).hash()


def cache_invalidating_env() -> str:
    """The environment variables Triton's own cache key reads, with their values ("" where Triton has no list)."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
    except ImportError:
        return ""
    return repr(sorted(get_cache_invalidating_env_vars().items()))


def build_cuda_utils() -> None:
    """Build (or find in the cache) Triton's CUDA helper module, without initialising CUDA as ``driver.active``
    would. Raises where there is no CUDA, or the Triton has no such module."""
    from triton.backends.nvidia.driver import CudaUtils

    CudaUtils()


#: the prefix of a group file's name (then the metadata file's name)
GROUP_PREFIX = "__grp__"

#: the binary each backend's compile leaves (its compiler's ``binary_ext``); both are ELF files
BINARY_EXTENSIONS = {"cuda": "cubin", "hip": "hsaco"}


def entry_names(key: str) -> set[str]:
    """The directory names Triton gives the entry of metadata ``hash`` ``key``: base32 of it, or itself."""
    names = {key}
    try:
        names.add(base64.b32encode(bytes.fromhex(key)).decode("ascii").rstrip("="))
    except ValueError:
        pass
    return names


#: the module of Triton's interpreter (``TRITON_INTERPRET=1``), imported by Triton only where a kernel uses it
INTERPRETER_MODULE = "triton.runtime.interpreter"

#: a pointer argument specializes on whether its address is a multiple of this
POINTER_ALIGNMENT = 16


def constexpr_function_type() -> type | None:
    """``@triton.constexpr_function``'s class (Triton 3.8+), or None."""
    from triton.runtime import jit as triton_jit

    return getattr(triton_jit, "ConstexprFunction", None)
