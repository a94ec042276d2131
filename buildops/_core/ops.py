"""The op decorators: ``@lists_kernels`` and ``@builds_by_running``.

A decorated op is a ``wrapt.FunctionWrapper``, so it behaves like the function it wraps on plain functions,
methods and ``nn.Module.forward`` alike, and keeps its name, docstring and signature. With ``BUILDOPS=0`` at
decoration time the decorators return the function itself: no wrapper, no cost.

Per call:
  * Outside a pass, when none of the op's builds is pending, the call goes straight to the function after one
    check. When some are pending, the call computes its signature and waits for that signature's builds only.
  * Inside a pass, the first call per call signature sweeps the op's dims, lists the builds for each swept shape,
    hands them to the pass, and returns the op's placeholder output; later calls with that signature in the pass
    return the placeholder only.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, ParamSpec, Protocol, TypeAlias, TypeVar, cast

import torch
import wrapt

from .._config import settings
from .build import Build
from .builder import on_builder_thread
from .default import current_builder
from .listing import replay
from .passes import BuildPass, _current, active
from .specs import BuildConfig, SpecError, TensorSpec, call_signature, tensor_dims

logger = logging.getLogger("buildops")

__all__ = ["lists_kernels"]

Output: TypeAlias = str | Callable[..., Any] | None
Lister: TypeAlias = Callable[..., Iterable[Build]]
P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Op(Protocol[P, R_co]):
    """What a decorator returns: the op, called as the function it wraps, with two attributes of its own."""

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


def _is_method(fn: Callable) -> bool:
    """A function whose first parameter is ``self`` or ``cls``: defined in a class body, or assigned into one
    (``forward = rms_forward``). Called through an instance, it gets that instance from wrapt, not in ``args``."""
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] in ("self", "cls")


def _op_name(fn: Callable, name: str | None) -> str:
    # "make.<locals>.rmsnorm" reads as "rmsnorm"; "Attention.forward" stays as it is
    return name or getattr(fn, "__qualname__", repr(fn)).rpartition("<locals>.")[2]


class _Op:
    """What a decorated op knows: its function, swept dims, placeholder output, and how it makes builds."""

    def __init__(self, fn: Callable, config: BuildConfig, output: Output, name: str | None, decorator: str) -> None:
        if not callable(fn):
            raise TypeError(f"@{decorator} decorates functions and methods, got {fn!r}")
        self.fn = fn
        self.name = _op_name(fn, name)
        if not isinstance(config, BuildConfig):
            raise TypeError(f"@{decorator} on {self.name}: expected a BuildConfig as first argument, got {config!r}; "
                            f"e.g. @{decorator}(BuildConfig(DynamicSpec('x', dim=0)))")
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        self.method = _is_method(fn)
        self.config = config.resolve(self.name, params[1:] if self.method else params)
        if isinstance(output, str) and output not in self.signature.parameters:
            raise SpecError(f"@{decorator} on {self.name}: output={output!r} names no argument; "
                            f"its arguments are {list(self.signature.parameters)}")
        if output is not None and not isinstance(output, str) and not callable(output):
            raise TypeError(f"@{decorator} on {self.name}: output must be an argument name, a callable or None")
        self.output = output
        self.lister: Lister | None = None
        self.pending: dict[Hashable, list[concurrent.futures.Future]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<buildops op {self.name}>"

    # -- the call ---------------------------------------------------------------------------------------------

    def call(self, wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        """wrapt's wrapper (for a plain function, _FunctionOp.__call__ takes the fast path before it)."""
        build_pass = _current.get()
        if build_pass is not None and not build_pass._active:  # a context copied inside a pass that has ended
            build_pass = active(build_pass)
        if build_pass is None:
            # Never on a builder thread: a build that calls another op (a @builds_by_running body) would wait for
            # builds queued behind it on the same workers; there the inner op compiles as part of the build.
            if self.pending and not on_builder_thread():
                self._wait_for_own_builds(instance, args, kwargs)
            return wrapped(*args, **kwargs)
        return self._list(build_pass, instance, args, kwargs)

    def _bind(self, instance: Any, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        bound = self.signature.bind(instance, *args, **kwargs) if instance is not None and self.method \
            else self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound

    def _wait_for_own_builds(self, instance: Any, args: tuple, kwargs: dict) -> None:
        try:
            bound = self._bind(instance, args, kwargs)
            signature = call_signature(bound.arguments, self.config.swept(bound.arguments))
        except (TypeError, SpecError, AttributeError):
            return  # the call itself is malformed: let the function raise its own error
        with self._lock:
            futures = list(self.pending.get(signature, ()))
        builder = current_builder()
        if futures and builder is not None:
            try:
                builder.wait_for(futures, self.name)
            except Exception:  # serving never fails over a wait: the op runs, compiling what it must
                logger.warning("buildops: %s: waiting for its builds failed; it runs now and compiles what is not "
                               "built yet", self.name, exc_info=True)

    def _list(self, build_pass: BuildPass, instance: Any, args: tuple, kwargs: dict) -> Any:
        bound = self._bind(instance, args, kwargs)
        arguments = bound.arguments
        signature = call_signature(arguments, self.config.swept(arguments))
        if build_pass.first_call(self, signature):
            futures: list[concurrent.futures.Future] = []
            for dims in self.config.combinations(arguments):
                builds = self.builds(bound, dims)
                futures += build_pass.take(self.name, signature, dims, builds)
            if futures:
                self._note_pending(signature, futures)
        return self._placeholder(bound)

    def builds(self, bound: inspect.BoundArguments, dims: Mapping[str, int]) -> list[Build]:
        """The builds for one swept shape. Subclasses define how."""
        raise NotImplementedError

    def builds_for(self, *args: Any, **kwargs: Any) -> list[Build]:
        """``op.builds_for(*args, **kwargs)``: the builds the first call with these arguments would list in a pass,
        at every swept shape, returned instead of queued (for :class:`~buildops.OpFamily` implementations, which
        know a model's shapes before any forward). Tensors may be on the ``meta`` device: nothing is allocated.
        For a method, pass the instance first."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return [build for dims in self.config.combinations(bound.arguments) for build in self.builds(bound, dims)]

    def register_lister(self, fn: Lister) -> Lister:
        """``@op.lister``: register how the op lists its builds; returns ``fn`` unchanged.

        Contract: ``fn`` takes the op's own arguments (``self`` too, for a method) with every tensor replaced by a
        :class:`TensorSpec` at one swept shape and every swept int by its swept value; it returns the
        :class:`Build` objects that shape needs. It must not allocate GPU memory or compile anything itself.
        """
        if not callable(fn):
            raise TypeError(f"{self.name}.lister: expected a function, got {fn!r}")
        self.lister = fn
        return fn

    def _placeholder(self, bound: inspect.BoundArguments) -> Any:
        if self.output is None:
            return None
        if isinstance(self.output, str):
            return torch.zeros_like(bound.arguments[self.output])
        return self.output(*bound.args, **bound.kwargs)

    # -- pending builds ---------------------------------------------------------------------------------------

    def _note_pending(self, signature: Hashable, futures: list[concurrent.futures.Future]) -> None:
        builder = current_builder()
        if builder is None:
            return
        with self._lock:
            self.pending.setdefault(signature, []).extend(futures)
            builder.waiting_ops.add(self)
        for future in futures:  # outside the lock: a done future runs its callback right here
            future.add_done_callback(functools.partial(self._settle, signature))

    def _settle(self, signature: Hashable, _future: concurrent.futures.Future) -> None:
        with self._lock:
            futures = self.pending.get(signature)
            if futures is not None and all(f.done() for f in futures):
                del self.pending[signature]
            if not self.pending:
                builder = current_builder()
                if builder is not None:
                    builder.waiting_ops.discard(self)

    def forget_pending(self) -> None:
        """Drop every pending future (the builder that owned them is gone: shut down, or in a forked child)."""
        self._lock = threading.Lock()  # after a fork the parent's lock may be held by a thread that is gone
        self.pending = {}


class _ListingOp(_Op):
    """An op whose lister turns shape/dtype specs into builds; without a lister, listed by replay."""

    def builds(self, bound: inspect.BoundArguments, dims: Mapping[str, int]) -> list[Build]:
        if self.lister is None:  # no hand-written list: run the op's own host code with launches recorded
            return replay(self.name, self.fn, bound, self.config.shapes(dims), dims)
        specs = inspect.BoundArguments(bound.signature, bound.arguments.copy())
        shapes = self.config.shapes(dims)
        for name, value in bound.arguments.items():
            fitted = shapes.get(name, {})
            if isinstance(value, torch.Tensor):
                specs.arguments[name] = TensorSpec.like(value, tensor_dims(fitted))
            elif None in fitted:
                specs.arguments[name] = fitted[None]
        try:
            builds = list(self.lister(*specs.args, **specs.kwargs) or ())
        except Exception as error:  # a bug in the lister: it raises into the pass body, with where it came from
            if sys.version_info >= (3, 11):  # the error keeps its own type for whoever catches it
                error.add_note(f"buildops: raised by the lister of op {self.name} at swept dims {dict(dims)}")
            raise
        for build in builds:
            if not isinstance(build, Build):
                raise TypeError(f"the lister of {self.name} returned {build!r}; a lister returns Build objects")
        return builds


# -- the wrappers ---------------------------------------------------------------------------------------------

class _FunctionOp(wrapt.FunctionWrapper):
    """A decorated plain function, with the fast path ahead of wrapt's own dispatch: nothing pending, no pass.

    Methods are plain ``wrapt.FunctionWrapper`` objects instead: wrapt binds a subclass through a slower path,
    which would cost more than this saves. Their fast path is the first check in ``_Op.call``.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self._self_op
        if not op.pending and _current.get() is None:
            return self.__wrapped__(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def _wrap(fn: Callable[P, R], op: _Op) -> Op[P, R]:
    """The op's wrapper; ``.lister`` reaches the op through the wrapped function (a proxy forwards attributes)."""
    earlier = getattr(getattr(fn, "lister", None), "__self__", None)
    if isinstance(earlier, _Op):  # a second op on one function would take the first's .lister and .builds_for
        raise TypeError(f"buildops cannot decorate {op.name}: its function is already the op {earlier.name}, and an "
                        f"op's .lister lives on its function; give each op a function of its own (e.g. one that "
                        f"calls {getattr(fn, '__qualname__', fn)!s})")
    try:
        _attach(fn, op.register_lister, op.builds_for)
    except (AttributeError, TypeError) as error:
        raise TypeError(f"buildops cannot decorate {op.name}: it takes no attributes "
                        "(wrap it in a function)") from error
    wrapper = wrapt.FunctionWrapper(fn, op.call) if op.method else _FunctionOp(fn, op.call)
    # wrapt keeps ``_self_*`` attributes on the wrapper itself; its stubs leave out the proxy's __setattr__
    wrapper._self_op = op  # pyright: ignore[reportAttributeAccessIssue]
    return cast("Op[P, R]", wrapper)


def _attach(fn: Callable[..., Any], lister: Callable[[Lister], Lister], builds_for: Callable[..., list[Build]]) -> None:
    """Set ``fn.lister`` and ``fn.builds_for``; AttributeError or TypeError where ``fn`` takes no attributes."""
    target: Any = fn  # a function takes attributes, which its type does not declare
    target.lister = lister
    target.builds_for = builds_for


def _ignore_lister(fn: Lister) -> Lister:
    return fn


def _no_builds(*args: Any, **kwargs: Any) -> list[Build]:
    return []


def _transparent(fn: Callable[P, R]) -> Op[P, R]:
    """``BUILDOPS=0``: the function itself. ``.lister`` is accepted and ignored so decorated modules still import;
    ``.builds_for`` lists nothing."""
    try:
        _attach(fn, _ignore_lister, _no_builds)
    except (AttributeError, TypeError):
        pass
    return cast("Op[P, R]", fn)


def lists_kernels(config: BuildConfig, *, output: Output = None,
                  name: str | None = None) -> Callable[[Callable[P, R]], Op[P, R]]:
    """Decorate an op that lists its kernels' builds through a lister (``@op.lister``).

    Args:
        config: the op's swept dims.
        output: the placeholder the op returns in a build pass: an argument name (zeros like it), a callable
            taking the op's arguments and returning new tensors (zeros, e.g. ``torch.zeros_like``), or None.
        name: the op's name in reports and ``join(op=...)`` (default: the function's qualified name).
    """
    _refuse_bare_use("lists_kernels", config)

    def decorate(fn: Callable[P, R]) -> Op[P, R]:
        if not settings.enabled:
            return _transparent(fn)
        return _wrap(fn, _ListingOp(fn, config, output, name, "lists_kernels"))
    return decorate


def _refuse_bare_use(decorator: str, config: object) -> None:
    """``@lists_kernels`` without its arguments would replace the op with the inner decorator, silently."""
    if callable(config):
        raise TypeError(f"@{decorator} above {_op_name(config, None)} needs its BuildConfig: "
                        f"@{decorator}(BuildConfig(DynamicSpec('x', dim=0))), not @{decorator} alone")
