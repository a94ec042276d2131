"""What the builder did, per op (listed, built, failed, cancelled, seconds spent building and waiting) and per
build (when it ran, for how long, whether it compiled or found its artifact cached), what compiled late anyway,
and which ops listed nothing: per library, how many kernels were prebuilt (compiled, or found cached), skipped as
having nothing to compile, and compiled on first use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ._core.build import BuildRecord, BuildState
from ._core.default import current_builder
from ._core.late import LateCompile, late_compiles
from ._core.passes import ListedNothing, listed_nothing

__all__ = ["Coverage", "ListedNothing", "OpReport", "Report", "report"]


@dataclass(frozen=True)
class OpReport:
    """One op's builds: how many it listed, shared with another op, built, failed, cancelled and left pending, the
    seconds its builds ran and the seconds its calls waited for them."""

    op: str
    listed: int
    shared: int
    built: int
    failed: int
    cancelled: int
    pending: int
    build_seconds: float
    wait_seconds: float


class Coverage(tuple[int, int]):
    """One library's coverage. It compares and unpacks as the pair ``(prebuilt, late)``; its attributes split it:

    * ``prebuilt``: builds that ran and left the kernel in the library's cache, of which ``compiled`` compiled it,
      ``cached`` found it there already (on disk or in memory), and ``unknown`` did not say (the ``Build``
      contract's ``cached``);
    * ``late``: kernels compiled on first use after a pass;
    * ``skipped``: builds that had nothing to compile, by reason (e.g. Triton's interpreter mode), not counted
      as prebuilt;
    * ``elsewhere``: prebuilt builds that compiled somewhere other than where the library's builds go by default,
      by place and reason (the ``Build`` contract's ``where``: e.g. a Triton kernel whose source cannot travel to
      a worker process).
    """

    compiled: int
    cached: int
    skipped: Mapping[str, int]
    elsewhere: Mapping[str, int]

    def __new__(cls, prebuilt: int, late: int, compiled: int = 0, cached: int = 0,
                skipped: Mapping[str, int] | None = None, elsewhere: Mapping[str, int] | None = None) -> Coverage:
        self = super().__new__(cls, (prebuilt, late))
        self.compiled, self.cached = compiled, cached
        self.skipped = MappingProxyType(dict(skipped or {}))
        self.elsewhere = MappingProxyType(dict(elsewhere or {}))
        return self

    @property
    def prebuilt(self) -> int:
        return self[0]

    @property
    def late(self) -> int:
        return self[1]

    @property
    def unknown(self) -> int:
        """Prebuilt builds whose run did not say whether it compiled."""
        return self.prebuilt - self.compiled - self.cached

    def __repr__(self) -> str:
        return (f"Coverage(prebuilt={self.prebuilt}, late={self.late}, compiled={self.compiled}, "
                f"cached={self.cached}, skipped={dict(self.skipped)}, elsewhere={dict(self.elsewhere)})")

    def describe(self, library: str) -> list[str]:
        """The report's lines for this library."""
        split = ""
        if self.compiled or self.cached:
            unknown = f", {self.unknown} not known" if self.unknown else ""
            split = f" ({self.compiled} compiled, {self.cached} found cached{unknown})"
        lines = [f"{library}: {self.prebuilt} kernel(s) prebuilt{split}, {self.late} compiled late"]
        lines += [f"{library}: {n} build(s) skipped: {reason}" for reason, n in self.skipped.items()]
        lines += [f"{library}: {n} build(s) compiled in {where}" for where, n in self.elsewhere.items()]
        return lines


@dataclass(frozen=True)
class Report:
    """What :func:`report` returns: one :class:`OpReport` per op, each failure, the kernels built ahead and
    compiled late per library, and the ops that listed nothing in a pass."""

    ops: tuple[OpReport, ...]
    failures: tuple[tuple[str, str, str], ...]  # (op, build, error)
    prebuilt: dict[str, int] = field(default_factory=dict)  # per library ("triton", ...): builds built, not skipped
    late: tuple[LateCompile, ...] = ()
    builds: tuple[BuildRecord, ...] = ()  # every build submitted, in order
    listed_nothing: tuple[ListedNothing, ...] = ()  # ops whose first calls in a pass listed no build

    def coverage(self) -> dict[str, Coverage]:
        """Per library: a :class:`Coverage`, which compares as ``(kernels prebuilt, kernels compiled late)`` and
        splits the prebuilt into compiled and found cached, with the builds skipped as having nothing to
        compile."""
        libraries = set(self.prebuilt) | {late.library for late in self.late}
        compiled: dict[str, int] = {}
        cached: dict[str, int] = {}
        skipped: dict[str, dict[str, int]] = {}
        elsewhere: dict[str, dict[str, int]] = {}
        for record in self.builds:
            library = record.build.library
            if record.state is not BuildState.BUILT or not library:
                continue
            libraries.add(library)
            if record.skipped is not None:
                reasons = skipped.setdefault(library, {})
                reasons[record.skipped] = reasons.get(record.skipped, 0) + 1
            elif record.cached is not None:
                counts = cached if record.cached else compiled
                counts[library] = counts.get(library, 0) + 1
            if record.skipped is None and record.where is not None:
                places = elsewhere.setdefault(library, {})
                places[record.where] = places.get(record.where, 0) + 1
        return {lib: Coverage(self.prebuilt.get(lib, 0), sum(late.library == lib for late in self.late),
                              compiled.get(lib, 0), cached.get(lib, 0), skipped.get(lib), elsewhere.get(lib))
                for lib in sorted(libraries)}

    def total(self, field: str) -> float:
        """The sum over the ops of one :class:`OpReport` field.

        Args:
            field: the field's name, e.g. ``"built"`` or ``"build_seconds"``.
        """
        return sum(getattr(op, field) for op in self.ops)

    def format(self) -> str:
        """A plain-text table, one row per op, a total row, then each failure on a line, each library's coverage
        (prebuilt: compiled or found cached; skipped; compiled late), each late compile, and each op that listed
        nothing."""
        head = ("op", "listed", "shared", "built", "failed", "cancelled", "pending", "build s", "wait s")
        rows: list[Sequence[object]] = [
            (o.op, o.listed, o.shared, o.built, o.failed, o.cancelled, o.pending,
             f"{o.build_seconds:.2f}", f"{o.wait_seconds:.2f}") for o in self.ops]
        rows.append(("total", *(int(self.total(f)) for f in ("listed", "shared", "built", "failed", "cancelled",
                                                              "pending")),
                     f"{self.total('build_seconds'):.2f}", f"{self.total('wait_seconds'):.2f}"))
        widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]

        def line(row: Sequence[object]) -> str:  # the op name left-aligned, the figures right-aligned
            cells = enumerate(zip(row, widths))
            return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in cells)

        out = [line(head), line(["-" * w for w in widths]), *map(line, rows[:-1]), line(rows[-1])]
        out += [f"failed: {op}: {build}: {error}" for op, build, error in self.failures]
        out += [text for lib, coverage in self.coverage().items() for text in coverage.describe(lib)]
        out += [late.describe() for late in self.late]
        out += [entry.describe() for entry in self.listed_nothing]
        return "\n".join(out)


def report() -> Report:
    """A snapshot of the process's builder (empty if no build was ever submitted), the late compiles and the ops
    that listed nothing so far."""
    builder = current_builder()
    late = tuple(late_compiles())
    nothing = tuple(listed_nothing())
    if builder is None:
        return Report((), (), {}, late, (), nothing)
    stats, history = builder.snapshot()
    pending: dict[str, int] = {}
    prebuilt: dict[str, int] = {}
    failures = []
    for record in history:
        build, state = record.build, record.state
        if state in (BuildState.QUEUED, BuildState.BUILDING):
            pending[build.op] = pending.get(build.op, 0) + 1
        elif state is BuildState.FAILED:
            failures.append((build.op, build.describe(), f"{type(record.error).__name__}: {record.error}"))
        elif state is BuildState.BUILT and build.library and record.skipped is None:
            prebuilt[build.library] = prebuilt.get(build.library, 0) + 1
    ops = tuple(OpReport(op, s.listed, s.shared, s.built, s.failed, s.cancelled, pending.get(op, 0),
                         s.build_seconds, s.wait_seconds) for op, s in sorted(stats.items()))
    return Report(ops, tuple(failures), prebuilt, late, tuple(history), nothing)
