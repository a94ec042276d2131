"""What a decorated op does with a call (:class:`OpCore`), and ``@lists_kernels`` (``@builds_by_running`` is
in :mod:`.running`; the checks and the wrapper both share are in :mod:`.declaring`).

Per call:
  * Outside a pass, when none of the op's builds is pending, the call goes straight to the function after one
    check, made in C. When some are pending, the call waits for its own shape's builds only (see
    ``_own_futures`` and :mod:`.pending`).
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
from typing import Any

import torch

from .._config import settings
from .build import Build
from .builder import Builder
from .builder_threads import on_builder_thread
from .coverage import note_beyond_max, note_sweep
from .declaring import (
    Lister,
    Op,
    P,
    R,
    check_output,
    looks_like_method,
    refuse_bare_use,
    refuse_unlistable,
    transparent,
    with_static,
    wrap,
)
from .default import current_builder
from .early_starts import starting_early
from .listing import replay
from .names import claim_name, described, op_name
from .passes import BuildPass, active, pass_context, shape_key
from .pending import PendingBuilds
from .placeholders import Output, Placeholders
from .specs import BuildConfig, ResolvedConfig, SpecError
from .sweeps import Sweep, listing
from .tensor_specs import TensorSpec, tensor_dims

logger = logging.getLogger("buildops")

__all__ = ["ListingOp", "OpCore", "lists_kernels"]


class OpCore:
    """What a decorated op knows: its function, swept dims, placeholder output, and how it makes builds; and what
    it does with a call (the module docstring). Subclasses say how a shape's builds are made."""

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
        # it: a call bound to an instance is a method call, whatever the first parameter is named (bind).
        self.method = looks_like_method(described(fn))
        self._config = config
        self.config = self._resolve(self.method)
        check_output(decorator, self.name, output, self.signature)
        self.output = output
        self.lister: Lister | None = None
        self.pending = PendingBuilds()
        self._lock = threading.Lock()
        self._warned_beyond_max = False
        self.name, self.first_claim = claim_name(fn, name, decorator)
        if self.name != op_name(fn, name):
            self.config = self._resolve(self.method)  # its errors name the op as reports will
        self.placeholders = Placeholders(self.name, fn, output, decorator)

    def _resolve(self, method: bool) -> ResolvedConfig:
        params = list(self.signature.parameters.values())
        return self._config.resolve(self.name, params[1:] if method else params)

    def __repr__(self) -> str:
        return f"<buildops op {self.name}>"

    # -- the call ---------------------------------------------------------------------------------------------

    def call(self, wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        """wrapt's wrapper, for a call in a context a pass made current or with some of the op's builds pending:
        wrapt calls the function itself for any other (:func:`.declaring.wrap`)."""
        build_pass = active(pass_context.get())  # a context copied inside a pass keeps it after it has ended
        if build_pass is None:
            # Never on a builder thread: a build that calls another op (a @builds_by_running body) would wait for
            # builds queued behind it on the same workers; there the inner op compiles as part of the build. Nor
            # in a sweep's listing: a replay only records what the inner op launches.
            if self.pending.futures and not on_builder_thread() and not listing():
                self.settle_method(wrapped, instance)
                self._wait_for_own_builds(instance, args, kwargs)
            return wrapped(*args, **kwargs)
        self.settle_method(wrapped, instance)
        return self._list(build_pass, instance, args, kwargs)

    def settle_method(self, wrapped: Callable, instance: Any) -> None:
        """A call through an instance (``model(x)``: wrapt binds the function to it) shows the op is a method: its
        first parameter is the instance, whatever it is named, and the config's positions count from the second.
        Decoration could only guess (``_looks_like_method``). Through the class (``Cls.forward(model, x)``) wrapt
        takes the first argument for the instance too, which proves nothing: binding alone does not change then."""
        if not self.method and instance is not None and getattr(wrapped, "__self__", None) is instance:
            with self._lock:
                if not self.method:
                    self.config = self._resolve(True)  # a config that does not fit so raises here, naming the op
                    self.method = True

    def bind(self, instance: Any, args: tuple, kwargs: dict) -> inspect.BoundArguments:
        """The call's arguments by name, defaults applied. wrapt gives the instance of a call through an instance
        or its class apart from ``args``: it is the first parameter, whatever that is named."""
        bound = self.signature.bind(*args, **kwargs) if instance is None else \
            self.signature.bind(instance, *args, **kwargs)
        bound.apply_defaults()
        return bound

    def _wait_for_own_builds(self, instance: Any, args: tuple, kwargs: dict) -> None:
        try:
            bound = self.bind(instance, args, kwargs)
            signature = self.config.signature(bound.arguments)
        except (TypeError, SpecError, AttributeError):
            return  # the call itself is malformed: let the function raise its own error
        builder = current_builder()
        if builder is None:
            return
        if not self.pending.has(signature):
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
        every, shapes = self.pending.of(signature)
        try:
            called = self.config.called(bound.arguments)
        except SpecError:
            called = None
        if called is None or shapes is None:
            return every
        shape = shape_key(called)
        own = shapes.get(shape)
        sweep = self.pending.sweep(signature) if own is None else None
        if sweep is not None:  # a shape of the sweep not listed yet: listed now, ahead of the rest
            try:
                sweep.list(called)
            except Exception:
                logger.debug("buildops: %s: listing a call's shape ahead of its sweep failed", self.name,
                             exc_info=True)
            own = self.pending.of_shape(signature, shape)
        if own is not None:
            return own
        try:
            builds = self.builds(bound, called)
        except Exception:  # a listing that fails here: wait for every build of the signature
            logger.debug("buildops: %s: listing the builds of a call's shape failed; it waits for every pending "
                         "build of its signature", self.name, exc_info=True)
            return every
        own = [f for f in (builder.future(b.key) for b in builds if not b.serial) if f is not None]
        self.pending.keep_shape(signature, shape, own)
        return own

    def _list(self, build_pass: BuildPass, instance: Any, args: tuple, kwargs: dict) -> Any:
        bound = self.bind(instance, args, kwargs)
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
            sweep = self.pending.sweep(signature)
            if sweep is not None:  # a shape the first call's sweep left for later: the pass calls it, so now
                sweep.list(called)
        if called is not None:
            build_pass.note_called(self.name, signature, called)
        return self.placeholders.of(bound, self.infers_output)

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
        with starting_early(build_pass.start_early):
            builds = self.builds(bound, first)
        rest = [dims for dims in combinations if dims != first]
        if (rest and self.replays and build_pass.lists_later and builds
                and not any(b.uses_gpu and not b.loads_only and not b.serial for b in builds)):
            sweep = Sweep(self.name, build_pass, functools.partial(self._list_shape, build_pass, bound, signature),
                          rest)
            self.pending.add_sweep(signature, sweep)
            self._take(build_pass, signature, first, builds, sweep.done)
            build_pass.list_later(sweep)
            return
        listed = {shape_key(first): builds, **{shape_key(dims): self.builds(bound, dims) for dims in rest}}
        for dims in combinations:  # queued in the sweep's order
            self._take(build_pass, signature, dims, listed[shape_key(dims)])

    def _list_shape(self, build_pass: BuildPass, bound: inspect.BoundArguments, signature: Hashable,
                    dims: Mapping[str, int]) -> None:
        """List one shape of a sweep left for later, and queue its builds (as the pass that made the sweep)."""
        with starting_early(build_pass.start_early):
            builds = self.builds(bound, dims)
        self._take(build_pass, signature, dims, builds)

    def _take(self, build_pass: BuildPass, signature: Hashable, dims: Mapping[str, int], builds: list[Build],
              listing: concurrent.futures.Future | None = None) -> None:
        """Queue one shape's builds in the pass; a serving call at that shape waits for them (and, while its sweep
        is ``listing``, for any of its shapes)."""
        futures = build_pass.take(self.name, signature, dims, builds)
        # A serving call never waits for a serial build (a tuning): the library runs meanwhile without it
        own = [f for b, f in zip(builds, futures) if not b.serial]
        if own or listing is not None or self.pending.has_sweep(signature):
            self.pending.note(signature, {shape_key(dims): own}, listing)

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


class ListingOp(OpCore):
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
    refuse_bare_use("lists_kernels", config)

    def decorate(fn: Callable[P, R]) -> Op[P, R]:
        refuse_unlistable("lists_kernels", fn)
        if not settings.enabled:
            return transparent(fn, name)
        resolved = with_static("lists_kernels", op_name(fn, name), config, static, "eps")
        return wrap(fn, ListingOp(fn, resolved, output, name, "lists_kernels"))
    return decorate
