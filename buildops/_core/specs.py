"""Which dimensions of an op vary at run time, which values to build them for, and what identifies a call.

A :class:`DynamicSpec` names one varying dimension (an argument and a dim, or an int argument itself) and how to
sweep it from the value seen in a call. A :class:`BuildConfig` combines specs: the product of their sweeps, dims
tied to other dims, a filter, and a cap on the number of combinations, and the arguments left out of the call
signature (``static=``). :meth:`ResolvedConfig.signature` is what identifies a call apart from its swept dims
(:mod:`.signatures`): the first call per signature in a build pass lists builds, later ones do not.
"""

from __future__ import annotations

import inspect
import itertools
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from .signatures import STATIC, call_signature

__all__ = ["BuildConfig", "DynamicSpec", "ResolvedConfig", "SpecError"]

Sweep: TypeAlias = str | Sequence[int] | range | Callable[[int], Iterable[int]]
Follows: TypeAlias = str | Callable[[Mapping[str, int]], int] | None

_NAMED_SWEEPS = ("pow2", "pow2_odd", "exact")
# BuildConfig's default cap on the combinations one call may sweep
DEFAULT_MAX_COMBINATIONS = 4096


class SpecError(ValueError):
    """A :class:`DynamicSpec` or :class:`BuildConfig` does not fit the op it decorates or the call it sees."""


@dataclass(frozen=True)
class DynamicSpec:
    """One dimension of an op that varies at run time.

    Args:
        arg: the argument, by name or by position (positions count the call's own arguments, not ``self``).
        dim: the dimension of that tensor argument; ``None`` when the argument is itself an int (a token count).
        sweep: the values to build, from the value ``v`` the call has:
            ``"pow2"`` (default): 1, 2, 4, ... up to ``v``, and ``v`` itself;
            ``"pow2_odd"``: as ``"pow2"``, plus the odd size just below each power of two from 4 on (3, 7, 15,
            ...). Such a size rounds up to the same power of two but is not a multiple of 16, and Triton compiles
            integer arguments that are multiples of 16 (or equal to 1) as separate variants: with this sweep a
            token count of 100 finds both of its bucket's variants built, not only the aligned one;
            ``"exact"``: ``v`` alone;
            a sequence or ``range`` of ints: those values (buckets), whatever ``v`` is (``bytes`` are refused);
            a callable ``f(v)``: the ints it returns.
        max: no swept value ever exceeds it: values above are dropped, and the call's own value, where the sweep
            builds it (``"pow2"``, ``"pow2_odd"``, ``"exact"``), becomes ``max`` when above it. A sweep whose
            values all lie above it builds ``max``.
        name: how ties, filters and test recorders refer to the dim (default ``"x.0"``; ``"n"`` when ``dim`` is
            None).
        follows: instead of a sweep of its own, the dim takes its value from others: the name of a spec to equal,
            or a callable given the swept values by name that returns this dim's value.
    """

    arg: str | int
    dim: int | None = 0
    sweep: Sweep = "pow2"
    max: int | None = None
    name: str | None = None
    follows: Follows = None

    def __post_init__(self) -> None:
        where = f"DynamicSpec({self.arg!r}, dim={self.dim!r})"
        if isinstance(self.arg, bool) or not isinstance(self.arg, (str, int)):
            raise SpecError(f"{where}: arg must be an argument name or a position, got {type(self.arg).__name__}")
        if isinstance(self.arg, int) and self.arg < 0:
            raise SpecError(f"{where}: a position must be >= 0")
        if self.dim is not None and (isinstance(self.dim, bool) or not isinstance(self.dim, int)):
            raise SpecError(f"{where}: dim must be an int (or None for an int argument)")
        if isinstance(self.sweep, (bytes, bytearray, memoryview)):  # sequences of ints, but never meant as sizes
            raise SpecError(f"{where}: sweep={self.sweep!r} is {type(self.sweep).__name__}, not a sweep; a sweep is "
                            f"one of {_NAMED_SWEEPS}, a sequence of ints (e.g. sweep=[1, 16, 128]), a range, or a "
                            "callable of the call's value")
        if not (isinstance(self.sweep, (str, Sequence)) or callable(self.sweep)):
            raise SpecError(f"{where}: sweep must be one of {_NAMED_SWEEPS}, a sequence of ints, a range, or a "
                            f"callable of the call's value; got {self.sweep!r}")
        if isinstance(self.sweep, str) and self.sweep not in _NAMED_SWEEPS:
            raise SpecError(f"{where}: unknown sweep {self.sweep!r}; use one of {_NAMED_SWEEPS}, "
                            "a sequence of ints, a range, or a callable of the call's value")
        if isinstance(self.sweep, Sequence) and not isinstance(self.sweep, str):
            bad = [v for v in self.sweep if isinstance(v, bool) or not isinstance(v, int) or v < 0]
            if bad or len(self.sweep) == 0:
                raise SpecError(f"{where}: sweep buckets must be a non-empty sequence of ints >= 0, got {bad or '[]'}; "
                                f"a sweep is one of {_NAMED_SWEEPS}, a sequence of ints (e.g. sweep=[1, 16, 128]), "
                                "a range, or a callable of the call's value")
        if self.max is not None and (isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < 1):
            raise SpecError(f"{where}: max must be an int >= 1, got {self.max!r}")
        if self.follows is not None and not (isinstance(self.follows, str) or callable(self.follows)):
            raise SpecError(f"{where}: follows must be a spec name or a callable of the swept dims")

    @property
    def key(self) -> str:
        """The spec's name: ``name`` if given, else ``"arg.dim"`` (or ``"arg"`` for an int argument)."""
        if self.name is not None:
            return self.name
        return str(self.arg) if self.dim is None else f"{self.arg}.{self.dim}"

    def values(self, seen: int) -> list[int]:
        """The swept values for a call whose dim is ``seen``, capped at ``max``, sorted, without repeats."""
        sweep = self.sweep
        if isinstance(sweep, str):  # one of _NAMED_SWEEPS: __post_init__ refused any other
            if sweep == "exact":
                raw = [seen]
            else:
                powers = [1 << i for i in range(max(seen, 1).bit_length()) if (1 << i) <= seen]
                raw = powers + [seen]
                if sweep == "pow2_odd":
                    raw += [p - 1 for p in powers if p >= 4]
        elif callable(sweep):
            raw = list(sweep(seen))
        else:
            raw = list(sweep)
        bad = [v for v in raw if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        if bad:
            raise SpecError(f"DynamicSpec({self.arg!r}, dim={self.dim!r}): its sweep gave {bad} for the call's value "
                            f"{seen}; a sweep must give ints >= 0")
        if self.max is not None and any(v > self.max for v in raw):
            kept = [v for v in raw if v <= self.max]
            # The call's own value, capped: serving never exceeds max, and calls up to it need max's variants
            # (its power-of-two bucket, its alignment). A sweep with nothing left under max builds max too.
            if seen in raw or not kept:
                kept.append(self.max)
            raw = kept
        return sorted(set(raw))


def _resolve_arg(op: str, spec: DynamicSpec, params: list[inspect.Parameter]) -> str:
    """The parameter name a spec refers to, checked against the op's signature."""
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if isinstance(spec.arg, int):
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if spec.arg >= len(positional):
            raise SpecError(f"{op}: DynamicSpec({spec.arg}, dim={spec.dim}) refers to positional argument "
                            f"{spec.arg}, but {op} takes {len(positional)}: {positional}")
        return positional[spec.arg]
    if spec.arg not in names:
        raise SpecError(f"{op}: DynamicSpec({spec.arg!r}, dim={spec.dim}) names no argument of {op}; "
                        f"its arguments are {names}")
    return spec.arg


@dataclass(frozen=True)
class _Dim:
    """A spec resolved against one op: the parameter it reads and its place in the sweep."""

    spec: DynamicSpec
    param: str

    def read(self, op: str, bound: Mapping[str, Any]) -> int:
        """The dim's value in a call; a clear error when the argument does not have that dim."""
        value = bound.get(self.param)
        if self.spec.dim is None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"{op}: DynamicSpec({self.param!r}, dim=None) expects argument {self.param!r} "
                                f"to be an int, got {type(value).__name__}")
            return value
        shape = getattr(value, "shape", None)
        if shape is None:
            raise SpecError(f"{op}: DynamicSpec({self.param!r}, dim={self.spec.dim}) expects argument "
                            f"{self.param!r} to be a tensor, got {type(value).__name__}")
        if not -len(shape) <= self.spec.dim < len(shape):
            raise SpecError(f"{op}: DynamicSpec({self.param!r}, dim={self.spec.dim}): argument {self.param!r} "
                            f"has {len(shape)} dimension(s), shape {tuple(shape)}")
        return int(shape[self.spec.dim])

    @property
    def shown(self) -> str:
        """The spec as errors show it: ``DynamicSpec('x', dim=0) ('x.0')``."""
        return f"DynamicSpec({self.spec.arg!r}, dim={self.spec.dim!r}) ({self.spec.key!r})"

    def position(self, ndim: int) -> int:
        assert self.spec.dim is not None
        return self.spec.dim % ndim


class BuildConfig:
    """The dims an op sweeps, as the product of its specs' sweeps.

    Args:
        specs: one :class:`DynamicSpec` per varying dim; each (argument, dim) at most once.
        where: keep only combinations for which ``where(dims)`` is true (``dims`` maps spec names to values),
            e.g. ``lambda d: d["kv.1"] >= d["q.0"]``.
        max_combinations: past this many combinations a call fails with a clear error instead of queueing
            an unbounded number of builds.
    """

    def __init__(self, *specs: DynamicSpec, where: Callable[[Mapping[str, int]], bool] | None = None,
                 max_combinations: int = DEFAULT_MAX_COMBINATIONS) -> None:
        if not specs:
            raise SpecError("BuildConfig needs at least one DynamicSpec")
        for spec in specs:
            if not isinstance(spec, DynamicSpec):
                raise SpecError(f"BuildConfig takes DynamicSpec objects, got {spec!r}")
        names = [s.key for s in specs]
        for name in names:
            if names.count(name) > 1:
                raise SpecError(f"BuildConfig: two specs are named {name!r}; give one a distinct name=")
        free = {s.key for s in specs if s.follows is None}
        for spec in specs:
            if isinstance(spec.follows, str) and spec.follows not in free:
                raise SpecError(f"BuildConfig: spec {spec.key!r} follows {spec.follows!r}, which is not a swept "
                                f"spec of this config; swept specs: {sorted(free)}")
        if not free:
            raise SpecError("BuildConfig: every spec follows another; at least one must sweep")
        if where is not None and not callable(where):
            raise SpecError(f"BuildConfig: where= must be a callable of the swept dims (a dict of spec names to "
                            f"values) that returns whether to build them, e.g. lambda d: d['kv.1'] >= d['q.0']; "
                            f"got {where!r}")
        if isinstance(max_combinations, bool) or not isinstance(max_combinations, int) or max_combinations < 1:
            raise SpecError(f"BuildConfig: max_combinations must be an int >= 1, got {max_combinations!r}")
        self.specs = tuple(specs)
        self.where = where
        self.max_combinations = max_combinations
        self.static: tuple[str, ...] = ()

    def __repr__(self) -> str:
        static = f", static={self.static!r}" if self.static else ""
        return f"BuildConfig({', '.join(map(repr, self.specs))}{static})"

    def with_specs(self, *extra: DynamicSpec) -> BuildConfig:
        """A copy with more specs (used for dims that follow a swept one)."""
        copy = BuildConfig(*self.specs, *extra, where=self.where, max_combinations=self.max_combinations)
        copy.static = self.static
        return copy

    def with_static(self, names: str | Iterable[str]) -> BuildConfig:
        """A copy whose call signatures leave out the arguments ``names`` (the decorators' ``static=``): arguments
        that do not change what compiles. They are checked against the op when it is decorated."""
        names = (names,) if isinstance(names, str) else tuple(names)
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise SpecError(f"static= takes argument names, got {bad}")
        copy = self.with_specs()
        copy.static = tuple(dict.fromkeys((*self.static, *names)))
        return copy

    def resolve(self, op: str, params: list[inspect.Parameter]) -> ResolvedConfig:
        """Check the specs (and ``static`` names) against an op's parameters, at decoration time."""
        dims = [_Dim(spec, _resolve_arg(op, spec, params)) for spec in self.specs]
        seen: dict[tuple[str, int | None], str] = {}
        first: dict[str, _Dim] = {}  # each argument's first spec
        for d in dims:
            where = (d.param, d.spec.dim)
            if where in seen:
                raise SpecError(f"{op}: argument {d.param!r} dim {d.spec.dim} is named by two specs "
                                f"({seen[where]!r} and {d.spec.key!r}); keep one")
            seen[where] = d.spec.key
            other = first.setdefault(d.param, d)
            if (other.spec.dim is None) != (d.spec.dim is None):
                tensor, number = (other, d) if d.spec.dim is None else (d, other)
                raise SpecError(f"{op}: argument {d.param!r} is swept as a tensor by {tensor.shown} and as an int by "
                                f"{number.shown}; it is one or the other: keep one")
        # dim=0 and dim=-2 name one dim of a 2-D tensor: only a call's tensor can tell (ResolvedConfig.check_distinct)
        clashes = tuple((a, b) for a, b in itertools.combinations(dims, 2)
                        if a.param == b.param and a.spec.dim is not None and b.spec.dim is not None
                        and (a.spec.dim < 0) != (b.spec.dim < 0))
        names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        swept = {d.param: d.spec.key for d in dims}
        for name in self.static:
            if name not in names:
                raise SpecError(f"{op}: static= names {name!r}, which is not a parameter of {op}; its parameters "
                                f"are {names}")
            if name in swept:
                raise SpecError(f"{op}: static= names {name!r}, but {name!r} is swept (spec {swept[name]!r}): a "
                                f"swept argument is in every build already; take it out of static=")
        return ResolvedConfig(op, self, tuple(dims), frozenset(self.static), clashes)


@dataclass(frozen=True)
class ResolvedConfig:
    """A :class:`BuildConfig` bound to one op's parameters."""

    op: str
    config: BuildConfig
    dims: tuple[_Dim, ...]
    static: frozenset[str] = frozenset()
    #: pairs of specs of one argument, one counting dims from the start and one from the end (dim=0, dim=-2)
    clashes: tuple[tuple[_Dim, _Dim], ...] = ()

    def check_distinct(self, bound: Mapping[str, Any]) -> None:
        """Refuse a call in which two specs name the same dim of one tensor (``dim=0`` and ``dim=-2`` of a 2-D
        one): the dim would be swept twice, as two dims. Decoration refuses what it can tell without the tensor."""
        for a, b in self.clashes:
            a.read(self.op, bound)  # a clear error if the argument lacks either dim
            b.read(self.op, bound)
            shape = bound[a.param].shape
            if a.position(len(shape)) == b.position(len(shape)):
                raise SpecError(f"{self.op}: {a.shown} and {b.shown} name the same dim of argument {a.param!r}, "
                                f"which has {len(shape)} dimension(s), shape {tuple(shape)}: the dim would be swept "
                                "twice; keep one")

    def swept(self, bound: Mapping[str, Any]) -> dict[str, set[int]]:
        """Per argument, the positions of its dims that vary (``-1`` stands for an int argument itself, ``STATIC``
        for an argument named in ``static=``: :func:`.signatures.call_signature` leaves it out)."""
        out: dict[str, set[int]] = {name: {STATIC} for name in self.static}
        if self.clashes:
            self.check_distinct(bound)
        for d in self.dims:
            d.read(self.op, bound)  # a clear error if the argument lacks the dim
            pos = -1 if d.spec.dim is None else d.position(len(bound[d.param].shape))
            out.setdefault(d.param, set()).add(pos)
        return out

    def signature(self, bound: Mapping[str, Any]) -> tuple:
        """The call signature of a call (its bound arguments, defaults applied)."""
        return call_signature(bound, self.swept(bound))

    def combinations(self, bound: Mapping[str, Any]) -> list[dict[str, int]]:
        """Every combination of dim values to build for this call, each as ``{spec name: value}``."""
        seen = {d.spec.key: d.read(self.op, bound) for d in self.dims}
        if self.clashes:
            self.check_distinct(bound)
        free = [d for d in self.dims if d.spec.follows is None]
        tied = [d for d in self.dims if d.spec.follows is not None]
        sweeps = []
        for d in free:
            values = self._values(d, seen[d.spec.key])
            total = math.prod(len(s) for s in sweeps) * len(values)
            if total > self.config.max_combinations:
                raise SpecError(f"{self.op}: the sweep of {[x.spec.key for x in free]} gives more than "
                                f"max_combinations={self.config.max_combinations} combinations; narrow a sweep, "
                                "set max= on a spec, or raise max_combinations")
            sweeps.append(values)
        result = []
        for values in itertools.product(*sweeps):
            combo = {d.spec.key: v for d, v in zip(free, values)}
            for d in tied:
                follows = d.spec.follows
                assert follows is not None  # a tied dim follows another
                value = combo[follows] if isinstance(follows, str) else follows(dict(combo))
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise SpecError(f"{self.op}: spec {d.spec.key!r} follows to {value!r}; expected an int >= 0")
                combo[d.spec.key] = min(value, d.spec.max) if d.spec.max is not None else value
            if self.config.where is None or self.config.where(combo):
                result.append(combo)
        return result

    def _values(self, d: _Dim, seen: int) -> list[int]:
        """The spec's swept values; an error names the op and the spec (a sweep callable's keeps its own type)."""
        try:
            return d.spec.values(seen)
        except SpecError as error:
            raise SpecError(f"{self.op}: {error}") from None
        except Exception as error:  # a bug in the sweep callable: it raises into the pass body, with where it came from
            if sys.version_info >= (3, 11):  # as a lister's error: it keeps its own type for whoever catches it
                error.add_note(f"buildops: raised by the sweep= callable of {d.shown} of op {self.op} at the call's "
                               f"value {seen}")
            raise

    def beyond_max(self, bound: Mapping[str, Any]) -> dict[str, int] | None:
        """The combination of this call's own dim values, uncapped, where one of them exceeds its spec's ``max``
        (a pass called the op at a shape its sweep does not reach); None where none does or ``where`` leaves the
        call out."""
        combo = {d.spec.key: d.read(self.op, bound) for d in self.dims}
        if not any(d.spec.max is not None and combo[d.spec.key] > d.spec.max for d in self.dims):
            return None
        if self.config.where is not None and not self.config.where(combo):
            return None
        return combo

    def called(self, bound: Mapping[str, Any]) -> dict[str, int] | None:
        """The combination of this call's own dim values (each capped at its spec's ``max``, as the sweep caps
        it), or None where ``where`` leaves it out. A sweep may not contain it (an explicit list, a value between
        powers of two): its builds are what the call itself needs."""
        combo = {}
        if self.clashes:
            self.check_distinct(bound)
        for d in self.dims:
            value = d.read(self.op, bound)
            combo[d.spec.key] = min(value, d.spec.max) if d.spec.max is not None else value
        if self.config.where is not None and not self.config.where(combo):
            return None
        return combo

    def shapes(self, combo: Mapping[str, int]) -> dict[str, dict[int | None, int]]:
        """Per argument, ``{dim: value}`` for one combination (dim ``None``: the int argument itself; a dim may be
        negative, counted from the end as torch does)."""
        out: dict[str, dict[int | None, int]] = {}
        for d in self.dims:
            out.setdefault(d.param, {})[d.spec.dim] = combo[d.spec.key]
        return out
