"""What the passes swept, per op: the range of each swept dim, and the calls a pass made beyond a spec's ``max``
(their shapes are built too). Kept for the report (:func:`swept`, :func:`beyond_max`) until
``buildops.testing.reset``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .state import core

__all__ = ["BeyondMax", "Swept", "beyond_max", "note_beyond_max", "note_sweep", "swept"]


@dataclass(frozen=True)
class Swept:
    """One swept dim of an op, over every first call of every pass so far: ``values`` distinct values from
    ``low`` to ``high``."""

    op: str
    dim: str
    low: int
    high: int
    values: int

    def describe(self) -> str:
        return f"{self.dim} {self.low}" if self.low == self.high else \
            f"{self.dim} {self.low}..{self.high} ({self.values} values)"


@dataclass(frozen=True)
class BeyondMax:
    """A pass called ``op`` at ``dims``, beyond its specs' ``maxima``: that shape was built too."""

    op: str
    dims: Mapping[str, int] = field(default_factory=dict)
    maxima: Mapping[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return (f"op {self.op}: a pass called it at {dict(self.dims)}, beyond its sweep's max {dict(self.maxima)}; "
                f"that shape was built too")


def note_sweep(op: str, combinations: Iterable[Mapping[str, int]]) -> None:
    """A first call of ``op`` in a pass swept these combinations of its dims."""
    with core.coverage_lock:
        for dims in combinations:
            for dim, value in dims.items():
                core.swept.setdefault((op, dim), set()).add(value)


def note_beyond_max(op: str, dims: Mapping[str, int], maxima: Mapping[str, int]) -> None:
    with core.coverage_lock:
        core.beyond_max.append(BeyondMax(op, dict(dims), dict(maxima)))


def swept() -> tuple[Swept, ...]:
    """Each op's swept dims, by op and dim."""
    with core.coverage_lock:
        return tuple(Swept(op, dim, min(values), max(values), len(values))
                     for (op, dim), values in sorted(core.swept.items()) if values)


def beyond_max() -> tuple[BeyondMax, ...]:
    """The calls passes made beyond a spec's max, in order."""
    with core.coverage_lock:
        return tuple(core.beyond_max)
