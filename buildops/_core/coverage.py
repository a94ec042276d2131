"""What the passes swept, per op: the range of each swept dim, and the calls a pass made beyond a spec's ``max``
(their shapes are built too). Kept for the report (:func:`swept`, :func:`beyond_max`) until
``buildops.testing.reset``."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .._runtime.forking import free_in_child
from .._runtime.hooks import on_reset

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


class _Coverage:
    def __init__(self) -> None:
        self.lock = free_in_child(threading.Lock())
        self.values: dict[tuple[str, str], set[int]] = {}
        self.beyond: list[BeyondMax] = []


_state = _Coverage()


def note_sweep(op: str, combinations: Iterable[Mapping[str, int]]) -> None:
    """A first call of ``op`` in a pass swept these combinations of its dims."""
    with _state.lock:
        for dims in combinations:
            for dim, value in dims.items():
                _state.values.setdefault((op, dim), set()).add(value)


def note_beyond_max(op: str, dims: Mapping[str, int], maxima: Mapping[str, int]) -> None:
    with _state.lock:
        _state.beyond.append(BeyondMax(op, dict(dims), dict(maxima)))


def swept() -> tuple[Swept, ...]:
    """Each op's swept dims, by op and dim."""
    with _state.lock:
        return tuple(Swept(op, dim, min(values), max(values), len(values))
                     for (op, dim), values in sorted(_state.values.items()) if values)


def beyond_max() -> tuple[BeyondMax, ...]:
    """The calls passes made beyond a spec's max, in order."""
    with _state.lock:
        return tuple(_state.beyond)


@on_reset.add
def _forget() -> None:
    with _state.lock:
        _state.values.clear()
        _state.beyond.clear()


