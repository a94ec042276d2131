"""How ``JITFunction.run`` finds a launch's compiled kernel, version by version: the reading of Triton's internals
that a build's key depends on, kept here so that a new Triton changes one place. Checked against 3.6, 3.7.1, 3.8
and 3.9 (pyproject.toml's bounds; CI runs the suite on the oldest and the newest).

Where they differ: 3.6 keys a launch on its specialization and its options (``debug``, ``instrumentation_mode``
and the caller's); 3.7 adds the pipeline of a stages inspection hook, where one is set; 3.9 adds the option
``fpsan_homomorphic_casts``. In every one the binder that specializes a launch is the fifth item of the
function's cache for the device.
"""

from __future__ import annotations

import re
from typing import Any

import triton
from triton import knobs
from triton.runtime.jit import JITFunction, compute_cache_key

__all__ = ["VERSION", "launch_key", "launch_specialization"]


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
