"""Torch's Python meta kernels, run by a replay, without importing torch's dynamo.

Most of torch's meta kernels (``x + y`` on meta tensors is one) are Python references wrapped in
``torch._disable_dynamo``, whose first call imports torch's dynamo, and sympy with it, to build the wrapper that
turns dynamo off while the reference runs: about a second of Python on a replay's thread, in a process that may
never use dynamo (docs/decisions/0024-meta-kernels-without-dynamo.md). Torch wraps the ``__torch_dispatch__`` of
every dispatch mode the same way, the replay's own router to aten overrides (:mod:`.custom_ops`) among them.

Until dynamo is imported no frame can run under it, so that wrapper would only call the reference. Torch keeps the
wrapper it builds on the reference (its ``__dynamo_disable`` attribute, read before it imports anything). While a
replay runs (:func:`dynamo_unimported`), a :class:`_UntilDynamo` stands there: it calls the reference directly
while dynamo is not imported, and through dynamo's ``disable`` if another thread imports it meanwhile. After the
replay the references are as torch left them. Where this torch's wrapper is not the one described here, nothing
stands in and the first such call imports dynamo as before.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .state import core

__all__ = ["dynamo_unimported", "find_stand_ins"]

logger = logging.getLogger("buildops")

_CACHE = "__dynamo_disable"  # the attribute torch's wrapper keeps its dynamo-disabled function in


class _UntilDynamo:
    """Stands in for ``fn``'s dynamo-disabled function while dynamo is not imported; once another thread has imported
    it, calls the function torch's wrapper would have built (built once)."""

    def __init__(self, fn: types.FunctionType, recursive: bool) -> None:
        self.fn, self.recursive = fn, recursive
        self.disabled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        if self.disabled is None:
            self.disabled = _dynamo_disabled(self.fn, self.recursive)
        return self.disabled(*args, **kwargs)

    def put_in(self) -> bool:
        """Stand in, unless torch's own wrapper is there already (it stays); whether it did."""
        if _CACHE in self.fn.__dict__:
            return False
        self.fn.__dict__[_CACHE] = self
        return True

    def take_out(self) -> None:
        """Leave the attribute as torch would have it: torch's own wrapper, if one came since, else none."""
        if self.fn.__dict__.get(_CACHE) is self:
            del self.fn.__dict__[_CACHE]


def _dynamo_disabled(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    """What torch's wrapper builds for ``fn`` once dynamo is imported (without a second ``functools.wraps`` where
    this torch's ``disable`` takes ``wrapping``, as the wrapper calls it)."""
    import inspect

    import torch._dynamo

    if "wrapping" in inspect.signature(torch._dynamo.disable).parameters:
        return torch._dynamo.disable(fn, recursive, wrapping=False)
    return torch._dynamo.disable(fn, recursive)


@contextlib.contextmanager
def dynamo_unimported() -> Iterator[None]:
    """Within: torch's Python meta kernels run without importing dynamo (see the module's docstring)."""
    _place()
    try:
        yield
    finally:
        _remove()


def find_stand_ins() -> None:
    """Find the stand-ins now, once per process (tens of milliseconds of Python): a start's background thread does,
    so that its first replay finds them found."""
    with core.replay_lock:
        _find_locked()


def _find_locked() -> list[_UntilDynamo]:
    if core.stand_ins is None and "torch._dynamo" not in sys.modules:
        try:
            core.stand_ins = list(_find())
        except Exception:  # a torch laid out otherwise: its meta kernels import dynamo, as they do without buildops
            logger.debug("buildops: finding torch's dynamo-disabled meta kernels failed", exc_info=True)
            core.stand_ins = []
    return core.stand_ins or []


def _place() -> None:
    """The first replay running puts the stand-ins in place."""
    with core.replay_lock:
        core.meta_replays += 1
        if core.meta_replays > 1 or "torch._dynamo" in sys.modules:
            return
        core.stand_ins_placed.extend(stand_in for stand_in in _find_locked() if stand_in.put_in())


def _remove() -> None:
    """The last replay to end takes them out: the references are as torch left them."""
    with core.replay_lock:
        # never below 0: a forked child starts at 0, though its forking thread may have been inside a replay
        core.meta_replays = max(0, core.meta_replays - 1)
        if core.meta_replays:
            return
        for stand_in in core.stand_ins_placed:
            stand_in.take_out()
        core.stand_ins_placed.clear()


def _find() -> Iterator[_UntilDynamo]:
    """A stand-in for each function ``torch._disable_dynamo`` wraps among torch's meta kernels, and for the replay's
    own dispatch mode (torch wraps every ``TorchDispatchMode``'s ``__torch_dispatch__`` so)."""
    import torch._compile

    from .custom_ops import AtenOverrideRouter

    inner_code = _wrapper_code(torch._compile._disable_dynamo)
    if inner_code is None:
        return
    names = inner_code.co_freevars
    roots = [*_meta_kernels(), vars(AtenOverrideRouter)["__torch_dispatch__"]]
    for inner in _wrappers(roots, inner_code):
        cells = {name: cell.cell_contents for name, cell in zip(names, inner.__closure__ or ())}
        if isinstance(cells.get("fn"), types.FunctionType):
            yield _UntilDynamo(cells["fn"], bool(cells.get("recursive", True)))


def _wrapper_code(disable_dynamo: Callable[..., Any]) -> types.CodeType | None:
    """The code of the wrapper ``torch._disable_dynamo`` returns, if it is the one this module knows: a closure
    over ``fn`` that reads its ``__dynamo_disable`` first; else None. (One that raises: see :func:`_find_locked`.)"""
    code = getattr(disable_dynamo(lambda: None), "__code__", None)
    if code is None or "fn" not in code.co_freevars or _CACHE not in code.co_consts + code.co_names:
        return None
    return code


def _meta_kernels() -> Iterator[Any]:
    """Torch's Python meta kernels and decompositions, and the references they call by name."""
    import torch._decomp
    import torch._refs

    for table in torch._decomp.global_decomposition_table.values():
        yield from table.values()
    for name, module in list(sys.modules.items()):
        if name == "torch._refs" or name.startswith("torch._refs."):
            yield from vars(module).values()


def _wrappers(roots: Iterable[Any], inner_code: types.CodeType) -> Iterator[types.FunctionType]:
    """The functions with code ``inner_code`` reachable from ``roots`` through ``__wrapped__`` and closures."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        fn = stack.pop()
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.__code__ is inner_code:
            yield fn
        wrapped = fn.__dict__.get("__wrapped__")
        if wrapped is not None:
            stack.append(wrapped)
        for cell in fn.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                pass
