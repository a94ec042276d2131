"""Listing by replay: run an op's own host code at a swept shape on fake tensors, with kernel launches recorded.

The list then comes from the code that will run, so it cannot drift from it. Fake tensors (``FakeTensorMode``)
keep shapes, dtypes, devices and strides but hold no memory and run no kernels; launches of Triton kernels are
recorded as builds by :func:`buildops.triton.recording`. Host code that needs real values (``.item()``, data-
dependent shapes) cannot be replayed: such an op registers a lister or uses ``@builds_by_running``.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Mapping

import torch

from ._builder import Build
from ._specs import SpecError

__all__ = ["ReplayError", "replay"]


class ReplayError(SpecError):
    """An op's host code could not run on fake tensors, so its builds cannot be listed by replay."""


def _fake_arguments(bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int, int]],
                    mode) -> inspect.BoundArguments:
    call = inspect.BoundArguments(bound.signature, bound.arguments.copy())
    for name, value in bound.arguments.items():
        dims = shapes.get(name, {})
        if -1 in dims:
            call.arguments[name] = dims[-1]
        elif isinstance(value, torch.Tensor):
            if dims:
                shape = list(value.shape)
                for dim, size in dims.items():
                    shape[dim] = size
                with mode:
                    call.arguments[name] = torch.empty(shape, dtype=value.dtype, device=value.device)
            else:
                call.arguments[name] = mode.from_tensor(value)
    return call


def replay(op: str, fn: Callable, bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int, int]],
           dims: Mapping[str, int]) -> list[Build]:
    """Run ``fn`` on fake versions of the call's arguments cut to one swept shape; return the launches as builds."""
    if importlib.util.find_spec("triton") is None:
        raise ReplayError(f"{op} has no lister, and listing by replay needs Triton, which is not installed: "
                          f"register a lister with @{op.split('.')[-1]}.lister")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .triton import recording

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # weights held by a module are real; that is fine
    call = _fake_arguments(bound, shapes, mode)
    with recording(op) as builds:
        try:
            with mode:
                fn(*call.args, **call.kwargs)
        except Exception as exc:
            raise ReplayError(
                f"replay of {op} at {dict(dims)} failed: {type(exc).__name__}: {exc}. Host code that needs real "
                f"data (e.g. .item()) cannot be replayed on fake tensors: register a lister with "
                f"@{op.split('.')[-1]}.lister, or decorate the op with @builds_by_running") from exc
    return builds
