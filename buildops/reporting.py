"""What the builder did, per op (listed, built, failed, cancelled, seconds spent building and waiting) and per
build (when it ran, for how long, whether it compiled or found its artifact cached), what compiled late anyway,
and which ops listed nothing: per library, how many kernels were prebuilt (compiled, or found cached), skipped as
having nothing to compile, and compiled on first use.

A report saves as JSON (:meth:`Report.save`) and loads back as a dict (:func:`.saved_reports.load_report`) that
:func:`format_report` prints as the same table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ._core.build import BuildRecord, BuildState
from ._core.coverage import BeyondMax, Swept, beyond_max, swept
from ._core.default import current_builder
from ._core.late import LateCompile, late_compiles
from ._core.passes import ListedNothing, listed_nothing
from ._core.sharing import StoreCounts
from ._runtime.files import write_atomically
from ._version import __version__
from .manifests import manifest_entries
from .saved_reports import FORMAT, OP_FIGURES, VERSION
from .startup import ready_time

__all__ = ["Coverage", "ListedNothing", "OpReport", "Report", "format_report", "report"]

# The table's headings: the op, then each figure.
_HEADINGS = ("op", "listed", "shared", "built", "failed", "cancelled", "pending", "build s", "wait s")


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

    def to_dict(self) -> dict[str, Any]:
        """The counts as JSON-able data: ``prebuilt``, ``late``, ``compiled``, ``cached``, ``unknown``, and
        ``skipped`` and ``elsewhere`` as dicts of counts."""
        return {"prebuilt": self.prebuilt, "late": self.late, "compiled": self.compiled, "cached": self.cached,
                "unknown": self.unknown, "skipped": dict(self.skipped), "elsewhere": dict(self.elsewhere)}


@dataclass(frozen=True)
class Report:
    """What :func:`report` returns: one :class:`OpReport` per op, each failure, the kernels built ahead and
    compiled late per library, the ops that listed nothing in a pass, and what the builds took from and gave to
    the build store (None without ``BUILDOPS_STORE``)."""

    ops: tuple[OpReport, ...]
    failures: tuple[tuple[str, str, str], ...]  # (op, build, error)
    prebuilt: dict[str, int] = field(default_factory=dict)  # per library ("triton", ...): builds built, not skipped
    late: tuple[LateCompile, ...] = ()
    builds: tuple[BuildRecord, ...] = ()  # every build submitted, in order
    listed_nothing: tuple[ListedNothing, ...] = ()  # ops whose first calls in a pass listed no build
    store: StoreCounts | None = None
    ready: float | None = None  # buildops.startup.ready_time() when the report was made
    swept: tuple[Swept, ...] = ()  # each op's swept dims over the passes so far
    beyond_max: tuple[BeyondMax, ...] = ()  # calls a pass made beyond a spec's max (built too)

    def tunings(self) -> dict[str, int | None]:
        """The tunings buildops built (serial builds, apart from compiles): ``built``, and of those
        ``before_ready`` and ``after_ready`` (behind serving) where a start was ready
        (:func:`buildops.startup.rehearse_then_load`), else None; late tunings are in :attr:`late`."""
        done = [(r.started + r.seconds) for r in self.builds
                if r.build.serial and r.state is BuildState.BUILT and r.started is not None]
        before = None if self.ready is None else sum(end <= self.ready for end in done)
        return {"built": len(done), "before_ready": before,
                "after_ready": None if before is None else len(done) - before}

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
        return {lib: Coverage(self.prebuilt.get(lib, 0),
                              sum(late.library == lib and late.kind == "compile" for late in self.late),
                              compiled.get(lib, 0), cached.get(lib, 0), skipped.get(lib), elsewhere.get(lib))
                for lib in sorted(libraries)}

    def total(self, field: str) -> float:
        """The sum over the ops of one :class:`OpReport` field.

        Args:
            field: the field's name, e.g. ``"built"`` or ``"build_seconds"``.
        """
        return sum(getattr(op, field) for op in self.ops)

    def to_dict(self, *, manifest: bool = False) -> dict[str, Any]:
        """The report as JSON-able data, the same that :meth:`save` writes and :func:`load_report` reads back.

        Its keys (version 1; a reader refuses any other ``format`` or ``version``):

        * ``format``: ``"buildops-report"``; ``version``: ``1``; ``buildops``: the version that made it;
        * ``ops``: one row per op, ``{"op", "listed", "shared", "built", "failed", "cancelled", "pending",
          "build_seconds", "wait_seconds"}`` (the :class:`OpReport` fields);
        * ``totals``: the same figures summed over the ops (no ``"op"``);
        * ``failures``: ``{"op", "build", "error"}`` each (the build as described in logs, the error as
          ``"Type: message"``);
        * ``coverage``: per library, ``{"prebuilt", "late", "compiled", "cached", "unknown", "skipped",
          "elsewhere"}``, ``skipped`` and ``elsewhere`` mapping a reason or place to a count (:class:`Coverage`);
        * ``late``: ``{"library", "kernel", "variant", "ops", "where", "kind"}`` each (:class:`LateCompile`);
        * ``listed_nothing``: ``{"op", "pass_name", "signatures"}`` each (:class:`ListedNothing`);
        * ``tunings``: ``{"built", "before_ready", "after_ready"}`` (:meth:`tunings`);
        * ``swept``: ``{"op", "dim", "low", "high", "values"}`` each: what the passes' sweeps covered;
        * ``beyond_max``: ``{"op", "dims", "maxima"}`` each: a pass's call beyond a spec's ``max``, built too;
        * ``store``: the :class:`~buildops._core.sharing.StoreCounts` fields (``store``, ``fetched``,
          ``fetched_bytes``, ``fetch_seconds``, ``stored``, ``stored_bytes``, ``known_locally``,
          ``waited_for_others``, ``built_after_others``, ``bad``, ``failed``), or null without a build store;
        * ``manifest``: only with ``manifest=True``, the entries :func:`buildops.manifests.save_manifest` would
          write for this process's builds (they hold kernels' source and pickled launches: they can be large).

        Counts are integers and seconds floats. The per-build history (:attr:`builds`) is not in it: its builds
        hold callables, and the counts above are what it sums to.

        Args:
            manifest: add the ``manifest`` key.
        """
        return {
            "format": FORMAT,
            "version": VERSION,
            "buildops": __version__,
            "ops": [asdict(op) for op in self.ops],
            "totals": {name: self._total_as_saved(name) for name in OP_FIGURES},
            "failures": [{"op": op, "build": build, "error": error} for op, build, error in self.failures],
            "coverage": {library: coverage.to_dict() for library, coverage in self.coverage().items()},
            "late": [{**asdict(late), "ops": list(late.ops)} for late in self.late],
            "listed_nothing": [asdict(entry) for entry in self.listed_nothing],
            "tunings": self.tunings(),
            "swept": [asdict(entry) for entry in self.swept],
            "beyond_max": [{"op": b.op, "dims": dict(b.dims), "maxima": dict(b.maxima)} for b in self.beyond_max],
            "store": None if self.store is None else asdict(self.store),
            **({"manifest": manifest_entries()} if manifest else {}),
        }

    def _total_as_saved(self, name: str) -> float:
        total = self.total(name)
        return float(total) if name.endswith("_seconds") else int(total)

    def save(self, path: str | os.PathLike[str], *, manifest: bool = False) -> None:
        """Write :meth:`to_dict` as JSON to ``path``, atomically: a reader sees the old file or the whole new one,
        never part of one. The file is written beside ``path``, then renamed over it.

        Args:
            path: where to write it.
            manifest: add the pass's manifest entries (:meth:`to_dict`'s ``manifest`` key).
        """
        write_atomically(Path(path), json.dumps(self.to_dict(manifest=manifest), indent=2) + "\n")

    def format(self) -> str:
        """A plain-text table, one row per op, a total row, then each failure on a line, each library's coverage
        (prebuilt: compiled or found cached; skipped; compiled late) and late tunings, each late compile or tuning,
        and each op that listed nothing. The same text as :func:`format_report` of :meth:`to_dict`."""
        return format_report(self.to_dict())


def report() -> Report:
    """A snapshot of the process's builder (empty if no build was ever submitted), the late compiles and the ops
    that listed nothing so far."""
    builder = current_builder()
    late = tuple(late_compiles())
    nothing = tuple(listed_nothing())
    if builder is None:
        return Report((), (), {}, late, (), nothing, swept=swept(), beyond_max=beyond_max())
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
    return Report(ops, tuple(failures), prebuilt, late, tuple(history), nothing, builder.store_counts(), ready_time(),
                  swept(), beyond_max())


def format_report(data: Mapping[str, Any]) -> str:
    """The text of :meth:`Report.format` for a report's dict: :meth:`Report.to_dict`, or what :func:`load_report`
    read from a saved one."""
    rows: list[Sequence[object]] = [_figures(row["op"], row) for row in data["ops"]]
    rows.append(_figures("total", data["totals"]))
    out = _table(_HEADINGS, rows)
    out += [f"failed: {f['op']}: {f['build']}: {f['error']}" for f in data["failures"]]
    out += [text for library, counts in data["coverage"].items() for text in _coverage(counts).describe(library)]
    tunings: dict[str, int] = {}
    for late in data["late"]:
        if late.get("kind") == "tuning":
            tunings[late["library"]] = tunings.get(late["library"], 0) + 1
    out += _swept_lines(data.get("swept") or [])
    out += [BeyondMax(b["op"], b["dims"], b["maxima"]).describe() for b in data.get("beyond_max") or []]
    out += _tunings_lines(data.get("tunings"))
    out += [f"{library}: {n} tuning(s) late (keys no pass listed; serving ran the nearest key's config meanwhile)"
            for library, n in sorted(tunings.items())]
    out += [LateCompile(**{**late, "ops": tuple(late["ops"])}).describe() for late in data["late"]]
    out += [ListedNothing(**entry).describe() for entry in data["listed_nothing"]]
    if data.get("store") is not None:
        out.append(describe_store(data["store"]))
    return "\n".join(out)


def _swept_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per op of what its sweeps covered: ``swept rms_norm: x.0 1..4096 (13 values)``."""
    by_op: dict[str, list[str]] = {}
    for entry in entries:
        by_op.setdefault(entry["op"], []).append(Swept(**entry).describe())
    return [f"swept {op}: {', '.join(dims)}" for op, dims in by_op.items()]


def _tunings_lines(tunings: Mapping[str, Any] | None) -> list[str]:
    """The report's line of the tunings built, none where there were none."""
    if not tunings or not tunings["built"]:
        return []
    if tunings["before_ready"] is None:
        return [f"tunings: {tunings['built']} built"]
    return [f"tunings: {tunings['built']} built, {tunings['before_ready']} before ready and "
            f"{tunings['after_ready']} after it (behind serving)"]


def describe_store(counts: Mapping[str, Any]) -> str:
    """One line of what builds took from and gave to the build store, from :class:`StoreCounts` as a dict."""
    line = (f"store {counts['store']}: {counts['fetched']} fetched ({_megabytes(counts['fetched_bytes'])}, "
            f"{counts['fetch_seconds']:.2f} s), {counts['stored']} stored ({_megabytes(counts['stored_bytes'])}), "
            f"{counts['known_locally']} known locally, {counts['waited_for_others']} waited for another node")
    if counts["built_after_others"]:
        line += f", {counts['built_after_others']} built here after another node held them too long"
    if counts["bad"]:
        line += f", {counts['bad']} bad in the store (built here)"
    if counts["failed"] is not None:
        line += f"; turned off: {counts['failed']}"
    return line


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _figures(name: str, row: Mapping[str, Any]) -> tuple[object, ...]:
    """One table row: the name, the counts, and the seconds with two decimals."""
    return (name, *(f"{row[key]:.2f}" if key.endswith("_seconds") else row[key] for key in OP_FIGURES))


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """The lines of a table: its heading, a rule, then the rows; the first column left-aligned, the others
    right-aligned, each as wide as its widest cell."""
    widths = [max(len(str(row[i])) for row in (head, *rows)) for i in range(len(head))]

    def line(row: Sequence[object]) -> str:
        cells = enumerate(zip(row, widths))
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in cells)

    return [line(head), line(["-" * w for w in widths]), *map(line, rows)]


def _coverage(counts: Mapping[str, Any]) -> Coverage:
    return Coverage(counts["prebuilt"], counts["late"], counts["compiled"], counts["cached"], counts["skipped"],
                    counts["elsewhere"])
