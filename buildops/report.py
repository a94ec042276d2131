"""What the builder did, per op: listed, built, failed, cancelled, seconds spent building and waiting."""

from __future__ import annotations

from dataclasses import dataclass

from ._builder import BuildState, current_builder

__all__ = ["OpReport", "Report", "report"]


@dataclass(frozen=True)
class OpReport:
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
    ops: tuple[OpReport, ...]
    failures: tuple[tuple[str, str, str], ...]  # (op, build, error)

    def total(self, field: str) -> float:
        return sum(getattr(op, field) for op in self.ops)

    def format(self) -> str:
        """A plain-text table, one row per op, a total row, then each failure on a line."""
        head = ("op", "listed", "shared", "built", "failed", "cancelled", "pending", "build s", "wait s")
        rows = [(o.op, o.listed, o.shared, o.built, o.failed, o.cancelled, o.pending,
                 f"{o.build_seconds:.2f}", f"{o.wait_seconds:.2f}") for o in self.ops]
        rows.append(("total", *(int(self.total(f)) for f in ("listed", "shared", "built", "failed", "cancelled",
                                                              "pending")),
                     f"{self.total('build_seconds'):.2f}", f"{self.total('wait_seconds'):.2f}"))
        widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]

        def line(row) -> str:  # the op name left-aligned, the figures right-aligned
            return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

        out = [line(head), line(["-" * w for w in widths]), *map(line, rows[:-1]), line(rows[-1])]
        out += [f"failed: {op}: {build}: {error}" for op, build, error in self.failures]
        return "\n".join(out)


def report() -> Report:
    """A snapshot of the process's builder (empty if no build was ever submitted)."""
    builder = current_builder()
    if builder is None:
        return Report((), ())
    stats = builder.stats()
    history = builder.history()
    pending: dict[str, int] = {}
    failures = []
    for build, state, _seconds, error in history:
        if state in (BuildState.QUEUED, BuildState.BUILDING):
            pending[build.op] = pending.get(build.op, 0) + 1
        elif state is BuildState.FAILED:
            failures.append((build.op, build.describe(), f"{type(error).__name__}: {error}"))
    ops = tuple(OpReport(op, s.listed, s.shared, s.built, s.failed, s.cancelled, pending.get(op, 0),
                         s.build_seconds, s.wait_seconds) for op, s in sorted(stats.items()))
    return Report(ops, tuple(failures))
