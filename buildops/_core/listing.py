"""Listing by replay: run an op's own host code at a swept shape on fake tensors, with kernel launches recorded.

The list then comes from the code that will run, so it cannot drift from it. Launches are recorded as builds by
the recorders backends register (each :class:`.extensions.Backend`'s ``recorder``). Host code that needs real
values (``.item()``, data-dependent shapes) cannot be replayed: such an op registers a lister or uses
``@builds_by_running``.

Two kinds of stand-in tensors, cheapest first (docs/decisions/0005-meta-tensors-before-fake-tensors.md):
  * ``meta`` tensors (every tensor argument, weights included, with its shape, strides, offset and dtype): plain
    torch, with two shortcuts (:class:`_MetaEmptyLike`, and torch's Python meta kernels run without importing
    dynamo: :mod:`.meta_refs`). Host code that reads a tensor's device (``x.is_cuda``,
    ``x.device.index``) or mixes an argument with a tensor it holds elsewhere fails on them, or may take another
    branch and launch nothing.
  * so when the meta run raises or records no launch, the host code runs again on fake tensors
    (``FakeTensorMode``), which keep the real devices and accept real tensors held elsewhere, but whose first use
    in a process sets up much of torch on a start's critical path.
A launch recorded from either is the same build: a recorder keys tensors by what a kernel compiles for (their
dtype and alignment), not by their device or data.

In both, a call to a torch custom op, or to an aten op that a library overrode from Python, runs that Python
implementation for the call's device (:mod:`.custom_ops`), not its fake one, so the launches behind it are recorded
too.

The same replay, at the call's own shapes, gives an op without ``output=`` its placeholder (:func:`placeholder`):
the host code's result with zeros for its tensors.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from . import extensions
from .build import Build
from .custom_ops import AtenOverrideRouter, CustomOpRouter, aten_overrides
from .meta_refs import dynamo_unimported
from .specs import SpecError
from .state import core
from .tensor_specs import tensor_dims

__all__ = ["ReplayError", "materialize", "output_template", "replay"]

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


class _MetaEmptyLike(CustomOpRouter):
    """``torch.empty_like`` of a contiguous meta tensor, made directly: ``torch.empty_strided`` with its strides;
    and, as its base class, custom ops routed to their implementation (one mode for both: each costs a Python call
    per torch call).

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
        return super().__torch_function__(func, types, args, kwargs)


def _fake(mode) -> Callable[[torch.Tensor, list[int] | None], torch.Tensor]:
    def make(value: torch.Tensor, shape: list[int] | None) -> torch.Tensor:
        if shape is None:
            return mode.from_tensor(value)
        with mode:
            return torch.empty(shape, dtype=value.dtype, device=value.device)
    return make


def _call_device(bound: inspect.BoundArguments) -> torch.device | None:
    """The device of the call's first tensor argument: the one meta stand-ins stand for."""
    for value in bound.arguments.values():
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _aten_router(device_type: str | None) -> contextlib.AbstractContextManager[Any]:
    """The router to the Python kernels libraries registered for aten ops, where there are any."""
    overridden = aten_overrides()
    return AtenOverrideRouter(device_type, overridden) if overridden else contextlib.nullcontext()


def _fix(op: str) -> str:
    short = op.split(".")[-1]
    return f"register a lister with @{short}.lister, or decorate the op with @builds_by_running"


def _output_fix(op: str) -> str:
    return (f"pass output= to the decorator of {op} (an argument name, whose zeros it returns, or a callable of its "
            f"arguments that returns its placeholder)")


class _Run:
    """One replay of an op's host code: what it recorded, returned, and which custom ops it could not route."""

    def __init__(self, builds: list[Build], result: Any, router: CustomOpRouter) -> None:
        self.builds, self.result, self.router = builds, result, router


def _run(op: str, fn: Callable, bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]],
         what: str, fix: str, fake_if_nothing_recorded: bool) -> _Run:
    """Run ``fn`` on meta (else fake) stand-ins of the call's arguments cut to ``shapes``, launches recorded."""
    recorders = extensions.launch_recorders()
    device = _call_device(bound)
    device_type = device.type if device is not None else None
    meta_unrouted = ""
    try:
        call = _stand_in_arguments(bound, shapes, _meta)
        router = _MetaEmptyLike(device_type)
        with _recording(op, recorders) as builds, router, _aten_router(device_type), dynamo_unimported():
            result = fn(*call.args, **call.kwargs)
        if builds or not fake_if_nothing_recorded:
            return _Run(builds, result, router)
        meta_unrouted = router.describe_unrouted()
    except Exception:  # the host code wants real devices: fake tensors have them
        logger.debug("buildops: replay of %s on meta tensors failed; replaying on fake tensors", op, exc_info=True)

    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)  # weights held by a module are real; that is fine
    call = _stand_in_arguments(bound, shapes, _fake(mode))
    router = CustomOpRouter(device_type)
    with _recording(op, recorders) as builds:
        try:
            # the routers above the fake mode: they see each call first
            with mode, router, _aten_router(device_type):
                result = fn(*call.args, **call.kwargs)
        except Exception as exc:
            unrouted = router.describe_unrouted() or meta_unrouted
            raise ReplayError(
                f"replay of {op} {what} failed: {type(exc).__name__}: {exc}"
                f"{f' ({unrouted})' if unrouted else ''}. Host code that needs real data (e.g. .item()) cannot be "
                f"replayed on fake tensors: {fix}") from exc
    return _Run(builds, result, router)


def replay(op: str, fn: Callable, bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]],
           dims: Mapping[str, int]) -> list[Build]:
    """Run ``fn`` on meta (else fake) versions of the call's arguments cut to one swept shape; return the launches
    as builds."""
    if not extensions.launch_recorders():
        raise ReplayError(f"{op} has no lister, and listing by replay needs a library whose launches it can "
                          f"record (Triton), which is not installed: register a lister with "
                          f"@{op.split('.')[-1]}.lister")
    run = _run(op, fn, bound, shapes, f"at {dict(dims)}", _fix(op), fake_if_nothing_recorded=True)
    if not run.builds and run.router.unrouted:
        with core.replay_lock:  # each (op, custom op) pair warned of once, not once per swept shape
            new = {name: why for name, why in run.router.unrouted.items() if (op, name) not in core.replay_warned}
            core.replay_warned.update((op, name) for name in new)
        if new:
            logger.warning("buildops: replay of %s recorded no launch; %s. A C++ kernel is compiled ahead and needs "
                           "no build; if it compiles on first use, %s", op,
                           "; ".join(f"custom op {name} ran its fake implementation: {why}"
                                     for name, why in new.items()), _fix(op))
    elif run.router.unrouted:
        logger.debug("buildops: replay of %s: %s", op, run.router.describe_unrouted())
    return run.builds


def output_template(op: str, fn: Callable, bound: inspect.BoundArguments) -> Any:
    """What ``fn`` returns for this call, from a replay at the call's own shapes, as a template for
    :func:`materialize`: zeros for its tensors (with their shape, dtype and, where that costs little memory,
    strides; on the tensor's device, which for a meta stand-in is the call's), other values as returned; tuples,
    lists, dicts and named tuples recursively. Launches are recorded and dropped: nothing compiles or runs."""
    run = _run(op, fn, bound, {}, "to infer its placeholder output", _output_fix(op), fake_if_nothing_recorded=False)
    device = _call_device(bound)
    try:
        return _template(run.result, device if device is not None else torch.device("cpu"))
    except _Opaque as opaque:
        raise SpecError(f"{op} returns {opaque.args[0]}, which holds tensors buildops cannot rebuild as zeros: give "
                        f"the op output= (a callable of its arguments returning the placeholder)") from None


class _TensorTemplate:
    """A tensor of the placeholder: what it takes to make zeros like it."""

    __slots__ = ("shape", "stride", "dtype", "device", "dense")

    def __init__(self, tensor: torch.Tensor, device: torch.device) -> None:
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        self.device = device if tensor.device.type == "meta" else tensor.device
        self.stride: tuple[int, ...] = ()
        self.dense = False
        if tensor.layout == torch.strided and tensor.numel() > 0:
            # Strides kept where the memory they span is about the tensor's own (a permutation, padding,
            # a broadcast); a view into a much larger tensor (a slice of a cache) gets contiguous zeros instead.
            self.stride = tuple(tensor.stride())
            span = 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.stride))
            self.dense = min(self.stride) >= 0 and span <= 2 * tensor.numel() + 64

    def zeros(self) -> torch.Tensor:
        if not self.dense:
            return torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
        return torch.zeros(span, dtype=self.dtype, device=self.device).as_strided(self.shape, self.stride)


class _Opaque(Exception):
    """A value that holds tensors in a form :func:`_rebuild` cannot rebuild (its type's name is the argument)."""


def _rebuild(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` with ``convert`` applied to each item of its tuples, lists and dicts and each field of its
    dataclasses, recursively; the containers keep their types (named tuples, torch's structseqs, dict subclasses).
    Raises :class:`_Opaque` for another object that holds a tensor among its attributes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _rebuild(getattr(value, f.name), convert) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    if isinstance(value, tuple):
        items = [_rebuild(v, convert) for v in value]
        if type(value) is tuple:
            return tuple(items)
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, list):
        items = [_rebuild(v, convert) for v in value]
        return items if type(value) is list else type(value)(items)
    if isinstance(value, dict):
        made = {k: _rebuild(v, convert) for k, v in value.items()}
        if type(value) is dict:
            return made
        rebuilt = copy.copy(value)  # keeps what a subclass holds besides its items (a defaultdict's factory)
        rebuilt.update(made)
        return rebuilt
    if not isinstance(value, torch.Tensor) and any(isinstance(v, torch.Tensor)
                                                   for v in getattr(value, "__dict__", {}).values()):
        raise _Opaque(type(value).__qualname__)
    return convert(value)


def _template(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor replaced by a :class:`_TensorTemplate` (containers rebuilt, others kept)."""
    return _rebuild(value, lambda v: _TensorTemplate(v, device) if isinstance(v, torch.Tensor) else v)


def materialize(template: Any) -> Any:
    """A fresh placeholder from an :func:`output_template`: new zeros for each of its tensors."""
    return _rebuild(template, lambda v: v.zeros() if isinstance(v, _TensorTemplate) else v)


@contextlib.contextmanager
def _recording(op: str, recorders: list[Callable[..., contextlib.AbstractContextManager[list[Build]]]]
               ) -> Iterator[list[Build]]:
    """Every registered library's launches recorded at once; yields the builds of all of them, in order."""
    with contextlib.ExitStack() as stack:
        lists = [stack.enter_context(recorder(op)) for recorder in recorders]
        builds: list[Build] = []
        yield builds
        builds.extend(build for recorded in lists for build in recorded)
