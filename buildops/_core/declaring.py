"""How an op is declared: the checks made where it is decorated, and the wrapper a decorator returns.

A decorated op is a ``wrapt.FunctionWrapper``, so it behaves like the function it wraps on plain functions,
methods and ``nn.Module.forward`` alike, and keeps its name, docstring and signature. With ``BUILDOPS=0`` at
decoration time the decorators return the function itself (:func:`transparent`): no wrapper, no cost.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from types import FunctionType, MethodType
from typing import Any, ParamSpec, Protocol, TypeAlias, TypeVar, cast, runtime_checkable

import wrapt

from .build import Build
from .names import described, hold_name, op_name, release_name, short_name
from .passes import in_pass
from .pending import PendingBuilds
from .placeholders import Output
from .specs import BuildConfig, SpecError

__all__ = ["Lister", "Op", "Wrapped", "check_output", "looks_like_method", "refuse_bare_use", "refuse_unlistable",
           "transparent", "with_static", "wrap"]

Lister: TypeAlias = Callable[..., Iterable[Build]]
P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Op(Protocol[P, R_co]):
    """What a decorator returns: the op, called as the function it wraps, with three attributes of its own."""

    #: the op's name in reports, recorders and ``join(op=...)``: the function's qualified name, qualified by
    #: module where another op has it (or ``name=``)
    op_name: str

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def __get__(self, instance: Any, owner: Any = None) -> Any: ...  # a method: bound as the function would be

    def lister(self, fn: Lister) -> Lister:
        """``@op.lister``: register how the op lists its builds; returns ``fn`` unchanged.

        Contract: ``fn`` takes the op's own arguments (``self`` too, for a method) with every tensor replaced by a
        :class:`~buildops.TensorSpec` at one swept shape and every swept int by its swept value; it returns the
        :class:`~buildops.Build` objects that shape needs. It must not allocate GPU memory or compile anything.
        """
        ...

    def builds_for(self, *args: Any, **kwargs: Any) -> list[Build]:
        """The builds the first call with these arguments would list in a pass, at every swept shape, returned
        instead of queued (for :class:`~buildops.OpFamily` implementations, which know a model's shapes before
        any forward). Tensors may be on the ``meta`` device: nothing is allocated. For a method, pass the
        instance first."""
        ...


@runtime_checkable
class Wrapped(Protocol):
    """What :func:`wrap` needs of an op (:class:`.ops.OpCore`)."""

    name: str
    method: bool  # its first parameter is the instance
    first_claim: bool  # it claimed its name first (a failed decoration gives the name back)
    pending: PendingBuilds

    def call(self, wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any: ...

    def register_lister(self, fn: Lister) -> Lister: ...

    def builds_for(self, *args: Any, **kwargs: Any) -> list[Build]: ...


def looks_like_method(fn: Callable) -> bool:
    """Whether ``fn`` takes the instance first, as far as decoration can tell: it is defined in a class body (its
    qualified name says so) and its first parameter is named ``self`` or ``cls``. Only a guess, for the checks made
    at decoration; calls settle it (:meth:`.ops.OpCore.bind`). A module-level function whose first parameter is named
    ``self`` (aten-style signatures: ``silu(self)``) is a function. A class body is not proof either: a
    ``staticmethod`` is defined there too, and its first parameter is the call's own."""
    params = list(inspect.signature(fn).parameters)
    if not params or params[0] not in ("self", "cls"):
        return False
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(qualname, str):
        return True
    scope = qualname.rpartition(".")[0]
    return bool(scope) and not scope.endswith("<locals>")


def check_output(decorator: str, op: str, output: Output, signature: inspect.Signature) -> None:
    """Refuse an ``output=`` that names no argument, or is neither a name, a callable, ``...`` nor None."""
    if isinstance(output, str) and output not in signature.parameters:
        raise SpecError(f"@{decorator} on {op}: output={output!r} names no argument; "
                        f"its arguments are {list(signature.parameters)}")
    if output is not None and output is not ... and not isinstance(output, str) and not callable(output):
        raise TypeError(f"@{decorator} on {op}: output must be an argument name, a callable or None")


def with_static(decorator: str, op: str, config: BuildConfig, static: str | Iterable[str],
                 example: str) -> BuildConfig:
    """``config`` with ``static`` arguments left out of its call signature; errors name the op and the fix."""
    if not static or not isinstance(config, BuildConfig):  # no BuildConfig: OpCore's own error says what to pass
        return config
    try:
        return config.with_static(static)
    except (SpecError, TypeError) as error:
        raise SpecError(f"@{decorator} on {op}: {error}; e.g. static=({example!r},)") from None


def refuse_unlistable(decorator: str, fn: Callable[..., Any]) -> None:
    """Refuse, where it is decorated, what no op can be: a class, an ``async def`` or a generator function. Each
    would be accepted and then list nothing (a class would even take the op's attributes itself). Refused with
    ``BUILDOPS=0`` too, so that turning buildops on never brings up an error that was there all along."""
    if isinstance(fn, type):
        name = short_name(fn)
        raise TypeError(f"@{decorator} cannot decorate the class {name}: an op is a function or method, and a "
                        f"class is neither (calling it makes an instance); decorate the method of {name} that "
                        f"launches the kernels instead, e.g. @{decorator}(...) above its `def forward(self, ...)`")
    function = described(fn)
    if inspect.isasyncgenfunction(function):
        kind, made = "async generator function", "an async generator"
    elif inspect.iscoroutinefunction(function):
        kind, made = "async function", "a coroutine"
    elif inspect.isgeneratorfunction(function):
        kind, made = "generator function", "a generator"
    else:
        return
    raise TypeError(f"@{decorator} cannot decorate the {kind} {short_name(function)}: a call of it runs none of its "
                    f"body, it only makes {made}, so buildops could neither list the kernels a call launches nor "
                    f"return a placeholder for it in a pass; decorate the plain function (a def with no yield) that "
                    f"it calls to launch its kernels instead")


def refuse_bare_use(decorator: str, config: object) -> None:
    """``@lists_kernels`` without its arguments would replace the op with the inner decorator, silently."""
    if callable(config):
        raise TypeError(f"@{decorator} above {op_name(config, None)} needs its BuildConfig: "
                        f"@{decorator}(BuildConfig(DynamicSpec('x', dim=0))), not @{decorator} alone")


# -- the wrappers ---------------------------------------------------------------------------------------------

class _MethodOp(wrapt.FunctionWrapper):
    """A decorated function whose first parameter is the instance (``self``/``cls``), bound to an instance as the
    function itself would be: a ``types.MethodType`` of the op. wrapt's own binding makes a proxy object on every
    attribute access, which costs several times the call itself (``benchmarks/overhead.py``).

    The op then sees the instance first in ``args`` and no ``instance``, as in a plain call ``forward(model, x)``: the
    same bound arguments, since the op already takes its first parameter for the instance (``OpCore.method``). An op
    guessed to be a plain function keeps wrapt's binding: its calls through an instance are what tell
    ``OpCore.settle_method`` that it is a method.
    """

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:  # through the class: wrapt's binding (``Cls.forward.lister``)
            return super().__get__(instance, owner)
        return MethodType(self, instance)


def wrap(fn: Callable[P, R], op: Wrapped) -> Op[P, R]:
    """The op's wrapper; ``.lister`` reaches the op through the wrapped function (a proxy forwards attributes)."""
    try:
        earlier = getattr(getattr(fn, "lister", None), "__self__", None)
        if isinstance(earlier, Wrapped):  # a second op on one function would take the first's .lister and .builds_for
            raise TypeError(f"buildops cannot decorate {op.name}: its function is already the op {earlier.name}, and "
                            f"an op's .lister lives on its function; give each op a function of its own (e.g. one "
                            f"that calls {getattr(fn, '__qualname__', fn)!s})")
        try:
            _attach(fn, op.register_lister, op.builds_for, op.name)
        except (AttributeError, TypeError) as error:
            raise TypeError(f"buildops cannot decorate {op.name}: it takes no attributes "
                            "(wrap it in a function)") from error
    except TypeError:
        if op.first_claim:
            release_name(op.name)
        raise
    # The fast path: wrapt calls ``enabled`` first and, where it is false, the function itself. This one is true in
    # a context that a pass has made current (and in copies of it: ``call`` finds whether the pass is still active)
    # and otherwise where some of the op's builds are pending; all in C, no Python frame.
    enabled = cast("Callable[[], bool]", functools.partial(in_pass.get, op.pending.futures))  # wrapt takes its truth
    kind = _MethodOp if op.method and isinstance(fn, FunctionType) else wrapt.FunctionWrapper
    wrapper = kind(fn, op.call, enabled=enabled)
    # wrapt keeps ``_self_*`` attributes on the wrapper itself; its stubs leave out the proxy's __setattr__
    wrapper._self_op = op  # pyright: ignore[reportAttributeAccessIssue]
    hold_name(op.name, wrapper)
    return cast("Op[P, R]", wrapper)


def _attach(fn: Callable[..., Any], lister: Callable[[Lister], Lister], builds_for: Callable[..., list[Build]],
            name: str) -> None:
    """Set ``fn.lister``, ``fn.builds_for`` and ``fn.op_name``; AttributeError or TypeError where ``fn`` takes no
    attributes."""
    target: Any = fn  # a function takes attributes, which its type does not declare
    target.lister = lister
    target.builds_for = builds_for
    target.op_name = name


def _ignore_lister(fn: Lister) -> Lister:
    return fn


def _no_builds(*args: Any, **kwargs: Any) -> list[Build]:
    return []


def transparent(fn: Callable[P, R], name: str | None = None) -> Op[P, R]:
    """``BUILDOPS=0``: the function itself. ``.lister`` is accepted and ignored so decorated modules still import;
    ``.builds_for`` lists nothing; ``.op_name`` is ``name`` or the short qualified name."""
    try:
        _attach(fn, _ignore_lister, _no_builds, op_name(fn, name))
    except (AttributeError, TypeError):
        pass
    return cast("Op[P, R]", fn)
