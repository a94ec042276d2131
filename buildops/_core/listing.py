"""Listing by replay: run an op's own host code at a swept shape on fake tensors, with kernel launches recorded.

The list then comes from the code that will run, so it cannot drift from it. Launches are recorded as builds by
the launch recorders backends register (:func:`.extensions.add_launch_recorder`). Host code that needs real values
(``.item()``, data-dependent shapes) cannot be replayed: such an op registers a lister or uses
``@builds_by_running``.

Two kinds of stand-in tensors, cheapest first (docs/decisions/0005-meta-tensors-before-fake-tensors.md):
  * ``meta`` tensors (every tensor argument, weights included, with its shape, strides, offset and dtype): plain
    torch, with one shortcut (:class:`_MetaEmptyLike`). Host code that reads a tensor's device (``x.is_cuda``,
    ``x.device.index``) or mixes an argument with a tensor it holds elsewhere fails on them, or may take another
    branch and launch nothing.
  * so when the meta run raises or records no launch, the host code runs again on fake tensors
    (``FakeTensorMode``), which keep the real devices and accept real tensors held elsewhere, but whose first use
    in a process sets up much of torch on a start's critical path.
A launch recorded from either is the same build: a recorder keys tensors by what a kernel compiles for (their
dtype and alignment), not by their device or data.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping

import torch

from . import extensions
from .build import Build
from .specs import SpecError, tensor_dims

__all__ = ["ReplayError", "replay"]

logger = logging.getLogger("buildops")


class ReplayError(SpecError):
    """An op's host code could not run on fake tensors, so its builds cannot be listed by replay."""


def _stand_in_arguments(bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]],
                        make: Callable[[torch.Tensor, list[int] | None], torch.Tensor]) -> inspect.BoundArguments:
    """The call's arguments with swept ints replaced, and each tensor by ``make(tensor, shape)``: ``shape`` is the
    swept shape, or None where the tensor keeps its own."""
    call = inspect.BoundArguments(bound.signature, bound.arguments.copy())
    for name, value in bound.arguments.items():
        dims = shapes.get(name, {})
        if None in dims:
            call.arguments[name] = dims[None]
        elif isinstance(value, torch.Tensor):
            shape = None
            if dims:
                shape = list(value.shape)
                for dim, size in tensor_dims(dims).items():
                    shape[dim] = size
            call.arguments[name] = make(value, shape)
    return call


def _meta(value: torch.Tensor, shape: list[int] | None) -> torch.Tensor:
    """A meta tensor like ``value`` (same strides and offset), or a contiguous one of ``shape``."""
    if shape is not None:
        return torch.empty(shape, dtype=value.dtype, device="meta")
    storage = torch.empty(value.untyped_storage().nbytes() // value.element_size(), dtype=value.dtype, device="meta")
    return storage.as_strided(value.shape, value.stride(), value.storage_offset())


class _MetaEmptyLike(torch.overrides.TorchFunctionMode):
    """``torch.empty_like`` of a contiguous meta tensor, made directly: ``torch.empty_strided`` with its strides.

    Torch's meta ``empty_like`` is a Python reference whose first call imports
    ``torch.fx.experimental.symbolic_shapes`` and sympy, holding the GIL the checkpoint's loader needs. The result
    is the one the GPU gives the real call: for a dense tensor ``empty_like`` keeps its strides. Anything else goes
    to torch.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty_like and len(args) == 1 and kwargs.keys() <= {"dtype"}:
            like = args[0]
            if (isinstance(like, torch.Tensor) and like.device.type == "meta" and like.layout == torch.strided
                    and like.is_contiguous()):
                return torch.empty_strided(like.shape, like.stride(), dtype=kwargs.get("dtype") or like.dtype,
                                           device="meta")
        return func(*args, **kwargs)


def _fake(mode) -> Callable[[torch.Tensor, list[int] | None], torch.Tensor]:
    def make(value: torch.Tensor, shape: list[int] | None) -> torch.Tensor:
        if shape is None:
            return mode.from_tensor(value)
        with mode:
            return torch.empty(shape, dtype=value.dtype, device=value.device)
    return make


def replay(op: str, fn: Callable, bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]],
           dims: Mapping[str, int]) -> list[Build]:
    """Run ``fn`` on meta (else fake) versions of the call's arguments cut to one swept shape; return the launches
    as builds."""
    recorders = extensions.launch_recorders()
    if not recorders:
        raise ReplayError(f"{op} has no lister, and listing by replay needs a library whose launches it can "
                          f"record (Triton), which is not installed: register a lister with "
                          f"@{op.split('.')[-1]}.lister")
    try:
        call = _stand_in_arguments(bound, shapes, _meta)
        with _recording(op, recorders) as builds, _MetaEmptyLike():
            fn(*call.args, **call.kwargs)
        if builds:
            return builds
    except Exception:  # the host code wants real devices: fake tensors have them
        logger.debug("buildops: replay of %s on meta tensors failed; replaying on fake tensors", op, exc_info=True)

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # weights held by a module are real; that is fine
    call = _stand_in_arguments(bound, shapes, _fake(mode))
    with _recording(op, recorders) as builds:
        try:
            with mode:
                fn(*call.args, **call.kwargs)
        except Exception as exc:
            raise ReplayError(
                f"replay of {op} at {dict(dims)} failed: {type(exc).__name__}: {exc}. Host code that needs real "
                f"data (e.g. .item()) cannot be replayed on fake tensors: register a lister with "
                f"@{op.split('.')[-1]}.lister, or decorate the op with @builds_by_running") from exc
    return builds


@contextlib.contextmanager
def _recording(op: str, recorders: list[Callable[..., contextlib.AbstractContextManager[list[Build]]]]
               ) -> Iterator[list[Build]]:
    """Every registered library's launches recorded at once; yields the builds of all of them, in order."""
    with contextlib.ExitStack() as stack:
        lists = [stack.enter_context(recorder(op)) for recorder in recorders]
        builds: list[Build] = []
        yield builds
        builds.extend(build for recorded in lists for build in recorded)
