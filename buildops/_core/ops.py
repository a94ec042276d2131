"""The op decorators: ``@lists_kernels`` and ``@builds_by_running``.

A decorated op is a ``wrapt.FunctionWrapper``, so it behaves like the function it wraps on plain functions,
methods and ``nn.Module.forward`` alike, and keeps its name, docstring and signature. With ``BUILDOPS=0`` at
decoration time the decorators return the function itself: no wrapper, no cost.

Per call:
  * Outside a pass, when none of the op's builds is pending, the call goes straight to the function after one
    check, made in C. When some are pending, the call waits for its own shape's builds only (see
    ``_own_futures``).
  * Inside a pass, the first call per call signature sweeps the op's dims, lists the builds for each swept shape,
    hands them to the pass, and returns the op's placeholder output; later calls with that signature in the pass
    return the placeholder only. Every call tells the pass its own shape (``BuildPass.note_called``).

Names: an op's default name is its function's qualified name as it reads in code (``make.<locals>.rmsnorm`` reads
``rmsnorm``); where another live op of another function already has that name, it is qualified by module
(``pkg.b.matmul``), so two ops never share a row of a report, a recorder's entry or a ``join(op=...)``. A function
decorated again (a module reloaded, a test's factory called twice) is the same op, and keeps its name.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import EllipsisType, FunctionType, MethodType
from typing import Any, ParamSpec, Protocol, TypeAlias, TypeVar, cast

import torch
import wrapt

from .._config import settings
from .build import Build
from .builder import Builder, on_builder_thread
from .coverage import note_beyond_max, note_sweep
from .default import current_builder
from .listing import materialize, output_template, replay
from .names import claim_name, described, hold_name, op_name, release_name, short_name
from .passes import BuildPass, _current, _in_pass, active, shape_key
from .signatures import call_signature
from .specs import BuildConfig, ResolvedConfig, SpecError, TensorSpec, tensor_dims
from .sweeps import Sweep, listing

logger = logging.getLogger("buildops")

__all__ = ["lists_kernels"]

# ``...`` (the default of @lists_kernels): the placeholder is inferred from a replay of the op's host code
Output: TypeAlias = str | Callable[..., Any] | EllipsisType | None
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


def _looks_like_method(fn: Callable) -> bool:
    """Whether ``fn`` takes the instance first, as far as decoration can tell: it is defined in a class body (its
    qualified name says so) and its first parameter is named ``self`` or ``cls``. Only a guess, for the checks made
    at decoration; calls settle it (:meth:`_Op._bind`). A module-level function whose first parameter is named
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


class _Op:
    """What a decorated op knows: its function, swept dims, placeholder output, and how it makes builds."""

    def __init__(self, fn: Callable, config: BuildConfig, output: Output, name: str | None, decorator: str) -> None:
        if not callable(fn):
            raise TypeError(f"@{decorator} decorates functions and methods, got {fn!r}")
        self.fn = fn
        self.decorator = decorator
        self.name = op_name(fn, name)  # for the errors below; the claimed name replaces it at the end
        if not isinstance(config, BuildConfig):
            raise TypeError(f"@{decorator} on {self.name}: expected a BuildConfig as first argument, got {config!r}; "
                            f"e.g. @{decorator}(BuildConfig(DynamicSpec('x', dim=0)))")
        self.signature = inspect.signature(described(fn))
        # Whether the first parameter is the instance must be known now, to check the config against the call's
        # own parameters (positions count them, not ``self``) and to fail here rather than in a pass. Calls settle
        # it: a call bound to an instance is a method call, whatever the first parameter is named (_bind).
        self.method = _looks_like_method(described(fn))
        self._config = config
        self.config = self._resolve(self.method)
        if isinstance(output, str) and output not in self.signature.parameters:
            raise SpecError(f"@{decorator} on {self.name}: output={output!r} names no argument; "
                            f"its arguments are {list(self.signature.parameters)}")
        if output is not None and output is not ... and not isinstance(output, str) and not callable(output):
            raise TypeError(f"@{decorator} on {self.name}: output must be an argument name, a callable or None")
        self.output = output
        self.lister: Lister | None = None
        # Never rebound: the op's wrapper reads this dict's truth (_wrap)
        self.pending: dict[Hashable, list[concurrent.futures.Future]] = {}
        # The same futures by swept shape (dims as sorted items), and, once a call asked, by a shape the sweep did
        # not hold: a serving call waits for its own shape's builds only.
        self._pending_shapes: dict[Hashable, dict[tuple, list[concurrent.futures.Future]]] = {}
        self._lock = threading.Lock()
        # The sweeps of first calls whose rest is still to be listed, by signature (see .sweeps)
        self._sweeps: dict[Hashable, Sweep] = {}
        self._templates: dict[Hashable, Any] = {}  # inferred placeholders by the call's full signature
        self._warned_beyond_max = False
        self.name, self._first_claim = claim_name(fn, name, decorator)
        if self.name != op_name(fn, name):
            self.config = self._resolve(self.method)  # its errors name the op as reports will

    def _resolve(self, method: bool) -> ResolvedConfig:
        params = list(self.signature.parameters.values())
        return self._config.resolve(self.name, params[1:] if method else params)

    def __repr__(self) -> str:
        return f"<buildops op {self.name}>"

    # -- the call ---------------------------------------------------------------------------------------------

    def call(self, wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        """wrapt's wrapper, for a call in a context a pass made current or with some of the op's builds pending:
        wrapt calls the function itself for any other (``_wrap``)."""
        build_pass = _current.get()
        if build_pass is not None and not build_pass._active:  # a context copied inside a pass that has ended
            build_pass = active(build_pass)
        if build_pass is None:
            # Never on a builder thread: a build that calls another op (a @builds_by_running body) would wait for
            # builds queued behind it on the same workers; there the inner op compiles as part of the build. Nor
            # in a sweep's listing: a replay only records what the inner op launches.
            if self.pending and not on_builder_thread() and not listing():
                self._settle_method(wrapped, instance)
                self._wait_for_own_builds(instance, args, kwargs)
            return wrapped(*args, **kwargs)
        self._settle_method(wrapped, instance)
        return self._list(build_pass, instance, args, kwargs)

    def _settle_method(self, wrapped: Callable, instance: Any) -> None:
        """A call through an instance (``model(x)``: wrapt binds the function to it) shows the op is a method: its
        first parameter is the instance, whatever it is named, and the config's positions count from the second.
        Decoration could only guess (``_looks_like_method``). Through the class (``Cls.forward(model, x)``) wrapt
        takes the first argument for the instance too, which proves nothing: binding alone does not change then."""
        if not self.method and instance is not None and getattr(wrapped, "__self__", None) is instance:
            with self._lock:
                if not self.method:
                    self.config = self._resolve(True)  # a config that does not fit so raises here, naming the op
                    self.method = True

    def _bind(self, instance: Any, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        """The call's arguments by name, defaults applied. wrapt gives the instance of a call through an instance
        or its class apart from ``args``: it is the first parameter, whatever that is named."""
        bound = self.signature.bind(*args, **kwargs) if instance is None else \
            self.signature.bind(instance, *args, **kwargs)
        bound.apply_defaults()
        return bound

    def _wait_for_own_builds(self, instance: Any, args: tuple, kwargs: dict) -> None:
        try:
            bound = self._bind(instance, args, kwargs)
            signature = self.config.signature(bound.arguments)
        except (TypeError, SpecError, AttributeError):
            return  # the call itself is malformed: let the function raise its own error
        builder = current_builder()
        if builder is None:
            return
        with self._lock:
            if signature not in self.pending:
                return
        try:
            futures = self._own_futures(builder, bound, signature)
            if futures:
                builder.wait_for(futures, self.name)
        except Exception:  # serving never fails over a wait: the op runs, compiling what it must
            logger.warning("buildops: %s: waiting for its builds failed; it runs now and compiles what is not "
                           "built yet", self.name, exc_info=True)

    def _own_futures(self, builder: Builder, bound: inspect.BoundArguments,
                     signature: Hashable) -> list[concurrent.futures.Future]:
        """The futures of the builds this call needs: those listed for its shape by the sweep; for a shape the
        sweep did not hold, those of the builds its own listing names (listed once per shape, while builds of
        the signature are pending); every one of the signature's where its shape cannot be told."""
        with self._lock:
            every = list(self.pending.get(signature, ()))
            shapes = self._pending_shapes.get(signature)
        try:
            called = self.config.called(bound.arguments)
        except SpecError:
            called = None
        if called is None or shapes is None:
            return every
        shape = shape_key(called)
        with self._lock:
            own = shapes.get(shape)
            sweep = self._sweeps.get(signature) if own is None else None
        if sweep is not None:  # a shape of the sweep not listed yet: listed now, ahead of the rest
            try:
                sweep.list(called)
            except Exception:
                logger.debug("buildops: %s: listing a call's shape ahead of its sweep failed", self.name,
                             exc_info=True)
            with self._lock:
                own = shapes.get(shape)
        if own is not None:
            return own
        try:
            builds = self.builds(bound, called)
        except Exception:  # a listing that fails here: wait for every build of the signature
            logger.debug("buildops: %s: listing the builds of a call's shape failed; it waits for every pending "
                         "build of its signature", self.name, exc_info=True)
            return every
        own = [f for f in (builder.future(b.key) for b in builds if not b.serial) if f is not None]
        with self._lock:
            shapes[shape] = own
        return own

    def _list(self, build_pass: BuildPass, instance: Any, args: tuple, kwargs: dict) -> Any:
        bound = self._bind(instance, args, kwargs)
        arguments = bound.arguments
        signature = self.config.signature(arguments)
        called = self.config.called(arguments)
        beyond = self.config.beyond_max(arguments)
        if beyond is not None:  # the pass's own shape, outside the sweep: built too, and the call's shape is that
            called = beyond
        if build_pass.first_call(self, signature):
            combinations = self.config.combinations(arguments)
            if beyond is not None and beyond not in combinations:
                combinations.append(beyond)
                self._warn_beyond_max(beyond)
            note_sweep(self.name, combinations)
            self._sweep(build_pass, bound, signature, called, combinations)
        elif called is not None:
            with self._lock:
                sweep = self._sweeps.get(signature)
            if sweep is not None:  # a shape the first call's sweep left for later: the pass calls it, so now
                sweep.list(called)
        if called is not None:
            build_pass.note_called(self.name, signature, called)
        return self._placeholder(bound)

    def _sweep(self, build_pass: BuildPass, bound: inspect.BoundArguments, signature: Hashable,
               called: Mapping[str, int] | None, combinations: list[dict[str, int]]) -> None:
        """List a first call's sweep: its own shape first, then the rest, now or after the pass's body.

        The call's own shape is listed first: a library that keeps the first kernel a key of its own meets (a
        launch cache) then keeps this call's, as a lazy run of this call would have. The rest waits for the end of
        the pass's body (:mod:`.sweeps`) where listing it costs a replay per shape, and where what the own shape
        listed says the rest can wait: builds, none of which does GPU work (ready waits for those)."""
        first = called if called in combinations else combinations[0] if combinations else None
        if first is None:
            return
        builds = self.builds(bound, first)
        rest = [dims for dims in combinations if dims != first]
        if (rest and self.replays and build_pass.lists_later and builds
                and not any(b.uses_gpu and not b.loads_only and not b.serial for b in builds)):
            sweep = Sweep(self.name, build_pass, functools.partial(self._list_shape, build_pass, bound, signature),
                          rest)
            with self._lock:
                self._sweeps[signature] = sweep
            self._take(build_pass, signature, first, builds, sweep.done)
            sweep.done.add_done_callback(functools.partial(self._sweep_listed, signature, sweep))
            build_pass.list_later(sweep)
            return
        listed = {shape_key(first): builds, **{shape_key(dims): self.builds(bound, dims) for dims in rest}}
        for dims in combinations:  # queued in the sweep's order
            self._take(build_pass, signature, dims, listed[shape_key(dims)])

    def _list_shape(self, build_pass: BuildPass, bound: inspect.BoundArguments, signature: Hashable,
                    dims: Mapping[str, int]) -> None:
        """List one shape of a sweep left for later, and queue its builds (as the pass that made the sweep)."""
        self._take(build_pass, signature, dims, self.builds(bound, dims))

    def _take(self, build_pass: BuildPass, signature: Hashable, dims: Mapping[str, int], builds: list[Build],
              listing: concurrent.futures.Future | None = None) -> None:
        """Queue one shape's builds in the pass; a serving call at that shape waits for them (and, while its sweep
        is ``listing``, for any of its shapes)."""
        futures = build_pass.take(self.name, signature, dims, builds)
        # A serving call never waits for a serial build (a tuning): the library runs meanwhile without it
        own = [f for b, f in zip(builds, futures) if not b.serial]
        if own or listing is not None or signature in self._sweeps:
            self._note_pending(signature, {shape_key(dims): own}, listing)

    def _sweep_listed(self, signature: Hashable, sweep: Sweep, _: concurrent.futures.Future) -> None:
        with self._lock:
            if self._sweeps.get(signature) is sweep:
                del self._sweeps[signature]

    def _warn_beyond_max(self, dims: Mapping[str, int]) -> None:
        """Say once per op that a pass called it beyond a spec's ``max``, which serving was said never to exceed."""
        with self._lock:
            if self._warned_beyond_max:
                return
            self._warned_beyond_max = True
        maxima = {d.spec.key: d.spec.max for d in self.config.dims if d.spec.max is not None}
        note_beyond_max(self.name, dims, maxima)
        logger.warning("buildops: %s: a pass calls it at %s, beyond its sweep's max %s; that shape is built too. "
                       "Raise max= to where serving goes, or call the op in the pass within it", self.name,
                       dict(dims), maxima)

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

    @property
    def infers_output(self) -> bool:
        """Whether a replay of the op's host code can give its placeholder (``output`` left out)."""
        return False

    @property
    def replays(self) -> bool:
        """Whether the op lists by replaying its host code, a replay per swept shape."""
        return False

    def _placeholder(self, bound: inspect.BoundArguments) -> Any:
        output = self.output
        if output is None:
            return None
        if isinstance(output, str):
            return torch.zeros_like(bound.arguments[output])
        if output is not ...:
            return output(*bound.args, **bound.kwargs)
        if not self.infers_output:
            raise SpecError(f"{self.name} returns nothing buildops can infer inside a pass: it has a lister, so its "
                            f"host code is not replayed, and its decorator has no output=. Pass output= to "
                            f"@{self.decorator} (an argument name, whose zeros it returns; a callable of its "
                            f"arguments that returns its placeholder; or None for an op that returns nothing)")
        return materialize(self._output_template(bound))

    def _output_template(self, bound: inspect.BoundArguments) -> Any:
        """The placeholder's template for this call, from a replay at the call's own shapes; kept per full
        signature (devices and strides too), since a pass calls an op with the same shapes again and again."""
        arguments = bound.arguments
        layout = tuple((name, value.device, value.stride()) for name, value in arguments.items()
                       if isinstance(value, torch.Tensor) and value.layout == torch.strided)
        try:
            key: Hashable = (call_signature(arguments, {}), layout)
            hash(key)
        except TypeError:  # nothing to key it by: replay every time
            key = None
        template = self._templates.get(key, _MISSING) if key is not None else _MISSING
        if template is not _MISSING:
            return template
        template = output_template(self.name, self.fn, bound)
        if key is not None:
            if len(self._templates) >= _TEMPLATES_KEPT:
                self._templates.clear()
            self._templates[key] = template
        return template

    # -- pending builds ---------------------------------------------------------------------------------------

    def _note_pending(self, signature: Hashable, by_shape: dict[tuple, list[concurrent.futures.Future]],
                      listing: concurrent.futures.Future | None = None) -> None:
        builder = current_builder()
        if builder is None:
            return
        futures = [f for listed in by_shape.values() for f in listed]
        if listing is not None:  # pending too, so that calls look for their shape while the sweep lists
            futures.append(listing)
        with self._lock:
            self.pending.setdefault(signature, []).extend(futures)
            shapes = self._pending_shapes.setdefault(signature, {})
            for shape, listed in by_shape.items():
                shapes.setdefault(shape, []).extend(listed)
            builder.waiting_ops.add(self)
        for future in futures:  # outside the lock: a done future runs its callback right here
            future.add_done_callback(functools.partial(self._settle, signature))

    def _settle(self, signature: Hashable, _future: concurrent.futures.Future) -> None:
        with self._lock:
            futures = self.pending.get(signature)
            if futures is not None and all(f.done() for f in futures):
                del self.pending[signature]
                self._pending_shapes.pop(signature, None)
            if not self.pending:
                builder = current_builder()
                if builder is not None:
                    builder.waiting_ops.discard(self)

    def forget_pending(self) -> None:
        """Drop every pending future (the builder that owned them is gone: shut down, or in a forked child)."""
        self._lock = threading.Lock()  # after a fork the parent's lock may be held by a thread that is gone
        self.pending.clear()  # not a new dict: the op's wrapper reads this one's truth (_wrap)
        self._pending_shapes = {}
        self._sweeps = {}


_TEMPLATES_KEPT = 256  # inferred placeholder templates an op keeps (by full signature) before starting over
_MISSING = object()


class _ListingOp(_Op):
    """An op whose lister turns shape/dtype specs into builds; without a lister, listed by replay."""

    @property
    def infers_output(self) -> bool:
        return self.lister is None

    @property
    def replays(self) -> bool:
        return self.lister is None

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
        # A build belongs to the op that listed it, whatever name its lister gave (triton_builds("rmsnorm", ...) in
        # an op named "pkg.b.rmsnorm"): reports and join(op=...) never merge two ops' builds.
        return [b if b.op == self.name else dataclasses.replace(b, op=self.name) for b in builds]


# -- the wrappers ---------------------------------------------------------------------------------------------

class _MethodOp(wrapt.FunctionWrapper):
    """A decorated function whose first parameter is the instance (``self``/``cls``), bound to an instance as the
    function itself would be: a ``types.MethodType`` of the op. wrapt's own binding makes a proxy object on every
    attribute access, which costs several times the call itself (``benchmarks/overhead.py``).

    The op then sees the instance first in ``args`` and no ``instance``, as in a plain call ``forward(model, x)``: the
    same bound arguments, since the op already takes its first parameter for the instance (``_Op.method``). An op
    guessed to be a plain function keeps wrapt's binding: its calls through an instance are what tell
    ``_settle_method`` that it is a method.
    """

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:  # through the class: wrapt's binding (``Cls.forward.lister``)
            return super().__get__(instance, owner)
        return MethodType(self, instance)


def _wrap(fn: Callable[P, R], op: _Op) -> Op[P, R]:
    """The op's wrapper; ``.lister`` reaches the op through the wrapped function (a proxy forwards attributes)."""
    try:
        earlier = getattr(getattr(fn, "lister", None), "__self__", None)
        if isinstance(earlier, _Op):  # a second op on one function would take the first's .lister and .builds_for
            raise TypeError(f"buildops cannot decorate {op.name}: its function is already the op {earlier.name}, and "
                            f"an op's .lister lives on its function; give each op a function of its own (e.g. one "
                            f"that calls {getattr(fn, '__qualname__', fn)!s})")
        try:
            _attach(fn, op.register_lister, op.builds_for, op.name)
        except (AttributeError, TypeError) as error:
            raise TypeError(f"buildops cannot decorate {op.name}: it takes no attributes "
                            "(wrap it in a function)") from error
    except TypeError:
        if op._first_claim:
            release_name(op.name)
        raise
    # The fast path: wrapt calls ``enabled`` first and, where it is false, the function itself. This one is true in
    # a context that a pass has made current (and in copies of it: ``call`` finds whether the pass is still active)
    # and otherwise where some of the op's builds are pending; all in C, no Python frame.
    enabled = cast("Callable[[], bool]", functools.partial(_in_pass.get, op.pending))  # wrapt takes its truth
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


def _transparent(fn: Callable[P, R], name: str | None = None) -> Op[P, R]:
    """``BUILDOPS=0``: the function itself. ``.lister`` is accepted and ignored so decorated modules still import;
    ``.builds_for`` lists nothing; ``.op_name`` is ``name`` or the short qualified name."""
    try:
        _attach(fn, _ignore_lister, _no_builds, op_name(fn, name))
    except (AttributeError, TypeError):
        pass
    return cast("Op[P, R]", fn)


def lists_kernels(config: BuildConfig, *, output: Output = ..., name: str | None = None,
                  static: str | Iterable[str] = ()) -> Callable[[Callable[P, R]], Op[P, R]]:
    """Decorate an op that lists its kernels' builds through a lister (``@op.lister``) or, without one, by
    replaying its host code.

    Args:
        config: the op's swept dims.
        output: the placeholder the op returns in a build pass: an argument name (zeros like it), a callable
            taking the op's arguments and returning new tensors (zeros, e.g. ``torch.zeros_like``), or None (the
            op returns nothing). Left out, it is inferred from a replay of the op's host code at the call's own
            shapes (zeros for the tensors it returns, other values as returned); an op with a lister is not
            replayed, so it needs ``output=``, or its first call in a pass raises.
        name: the op's name in reports and ``join(op=...)`` (default: the function's qualified name, qualified by
            module where another op has it). Another op's name given here is an error.
        static: names of arguments left out of the call signature, as for :func:`builds_by_running`. An op listed
            by replay needs it less: the replay records each launch's own specialization, so a call signature too
            many costs a replay, never a build.
    """
    _refuse_bare_use("lists_kernels", config)

    def decorate(fn: Callable[P, R]) -> Op[P, R]:
        _refuse_unlistable("lists_kernels", fn)
        if not settings.enabled:
            return _transparent(fn, name)
        resolved = _with_static("lists_kernels", op_name(fn, name), config, static, "eps")
        return _wrap(fn, _ListingOp(fn, resolved, output, name, "lists_kernels"))
    return decorate


def _with_static(decorator: str, op: str, config: BuildConfig, static: str | Iterable[str],
                 example: str) -> BuildConfig:
    """``config`` with ``static`` arguments left out of its call signature; errors name the op and the fix."""
    if not static or not isinstance(config, BuildConfig):  # no BuildConfig: _Op's own error says what to pass
        return config
    try:
        return config.with_static(static)
    except (SpecError, TypeError) as error:
        raise SpecError(f"@{decorator} on {op}: {error}; e.g. static=({example!r},)") from None


def _refuse_unlistable(decorator: str, fn: Callable[..., Any]) -> None:
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


def _refuse_bare_use(decorator: str, config: object) -> None:
    """``@lists_kernels`` without its arguments would replace the op with the inner decorator, silently."""
    if callable(config):
        raise TypeError(f"@{decorator} above {op_name(config, None)} needs its BuildConfig: "
                        f"@{decorator}(BuildConfig(DynamicSpec('x', dim=0))), not @{decorator} alone")
