"""DeepGEMM's process-global settings, read where the builds are made and set in the worker that runs them.

``set_num_sms``, ``set_tc_util`` and ``set_mk_alignment_for_contiguous_layout`` (and ``set_ignore_compile_dims`` /
``set_block_size_multiple_of``, where a getter exists) change the kernels DeepGEMM picks, and they are per process:
a build worker starts with DeepGEMM's defaults. An engine that changed one would find kernels missing at its first
calls, so the values of the process that makes the builds go with them, into their key and into the worker. Only
values other than the defaults are taken: a process that has not imported DeepGEMM has the defaults, and its
builds have the same key as those of one that imported it and changed nothing. Their names and defaults are in
:mod:`.versions`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

import torch

from . import versions
from .state import deep_gemm_state

__all__ = ["DEFAULT_SMS", "Knobs", "device_arch", "device_sms", "engine_knobs", "on_device", "set_in_worker"]

Knobs = tuple[tuple[str, Any], ...]

DEFAULT_SMS = 132  # the multiprocessors of an H100 or H200, where no GPU says


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made current: DeepGEMM reads the current GPU's properties once, at its first use."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def device_sms(device: torch.device | str) -> int:
    """The multiprocessors of ``device``, :data:`DEFAULT_SMS` for a CPU."""
    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS


def device_arch(device: torch.device | str) -> str:
    """The architecture DeepGEMM compiles ``device``'s kernels for (``sm_90``), or the device type of a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def engine_knobs(module: str, device: torch.device | str = "cpu") -> Knobs:
    """The settings in force in this process that differ from DeepGEMM's defaults, as ``(name, value)`` pairs
    (none if this process has not imported ``module``)."""
    # A setting with no known default is always taken.
    return _read(module, device, defaults={**versions.KNOB_DEFAULTS, versions.SMS_KNOB: device_sms(device)})


def _read(module: str, device: torch.device | str, defaults: dict[str, Any]) -> Knobs:
    loaded = sys.modules.get(module)
    if loaded is None:
        return ()
    knobs = []
    with on_device(torch.device(device)):
        for name, getter in versions.knob_getters(loaded).items():
            value = getter()
            if name not in defaults or value != defaults[name]:
                knobs.append((name, value))
    return tuple(knobs)


def set_in_worker(deep_gemm: Any, module: str, knobs: Sequence[tuple[str, Any]]) -> None:
    """Set ``knobs`` in this (worker) process, and the settings they leave out to this process's defaults."""
    # A worker runs builds made under different settings in turn: what a build does not give goes back to the
    # value this worker started with, not to the previous build's.
    defaults = deep_gemm_state.worker_defaults.get(module)
    if defaults is None:  # the settings as this process first found them
        defaults = deep_gemm_state.worker_defaults[module] = dict(_read(module, "cpu", defaults={}))
    for name, value in {**defaults, **dict(knobs)}.items():
        versions.set_knob(deep_gemm, name, value)
