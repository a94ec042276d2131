"""What the builder did, per op (listed, built, failed, cancelled, seconds spent building and waiting) and per
build (when it ran, for how long), and what compiled late anyway: per library, how many kernels were prebuilt
against how many compiled on first use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._core.build import BuildRecord, BuildState
from ._core.default import current_builder
from ._core.late import LateCompile, late_compiles

__all__ = ["OpReport", "Report", "report"]


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


@dataclass(frozen=True)
class Report:
    """What :func:`report` returns: one :class:`OpReport` per op, each failure, and the kernels built ahead and
    compiled late per library."""

    ops: tuple[OpReport, ...]
    failures: tuple[tuple[str, str, str], ...]  # (op, build, error)
    prebuilt: dict[str, int] = field(default_factory=dict)  # per library ("triton", ...): builds built
    late: tuple[LateCompile, ...] = ()
    builds: tuple[BuildRecord, ...] = ()  # every build submitted, in order

    def coverage(self) -> dict[str, tuple[int, int]]:
        """Per library: (kernels prebuilt, kernels compiled late)."""
        libraries = set(self.prebuilt) | {late.library for late in self.late}
        return {lib: (self.prebuilt.get(lib, 0), sum(late.library == lib for late in self.late))
                for lib in sorted(libraries)}

    def total(self, field: str) -> float:
        """The sum over the ops of one :class:`OpReport` field.

        Args:
            field: the field's name, e.g. ``"built"`` or ``"build_seconds"``.
        """
        return sum(getattr(op, field) for op in self.ops)

    def format(self) -> str:
        """A plain-text table, one row per op, a total row, then each failure on a line."""
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
        out += [f"{lib}: {built} kernel(s) prebuilt, {late} compiled late"
                for lib, (built, late) in self.coverage().items()]
        out += [late.describe() for late in self.late]
        return "\n".join(out)


def report() -> Report:
    """A snapshot of the process's builder (empty if no build was ever submitted)."""
    builder = current_builder()
    late = tuple(late_compiles())
    if builder is None:
        return Report((), (), {}, late)
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
        elif state is BuildState.BUILT and build.library:
            prebuilt[build.library] = prebuilt.get(build.library, 0) + 1
    ops = tuple(OpReport(op, s.listed, s.shared, s.built, s.failed, s.cancelled, pending.get(op, 0),
                         s.build_seconds, s.wait_seconds) for op, s in sorted(stats.items()))
    return Report(ops, tuple(failures), prebuilt, late, tuple(history))
