"""A builder's accounts: what each op asked of it and what became of each build, the figures reports read."""

from __future__ import annotations

from dataclasses import replace

from .build import BuildRecord, OpStats, Outcome, Record

__all__ = ["Ledger"]


class Ledger:
    """Per-op statistics, and every record the builder made, in order (cancelled ones included). Not locked: its
    builder calls it under the builder's own lock, so that counts and records agree at any instant."""

    def __init__(self) -> None:
        self._stats: dict[str, OpStats] = {}
        self._records: list[Record] = []

    def of(self, op: str) -> OpStats:
        """``op``'s statistics, to count into."""
        return self._stats.setdefault(op, OpStats())

    def made(self, record: Record) -> None:
        """A new record: it belongs to the history from now on."""
        self._records.append(record)

    def ran(self, record: Record, seconds: float, failed: bool) -> None:
        """A build's run ended (or was given up) after ``seconds``."""
        stats = self.of(record.build.op)
        stats.build_seconds += seconds
        if failed:
            stats.failed += 1
        else:
            stats.built += 1

    def stats(self) -> dict[str, OpStats]:
        """A copy of the per-op statistics."""
        return {op: replace(s) for op, s in self._stats.items()}

    def history(self) -> list[BuildRecord]:
        """A copy of every record, in order."""
        return [_copied(r, r.outcome or Outcome()) for r in self._records]


def _copied(record: Record, outcome: Outcome) -> BuildRecord:
    return BuildRecord(record.build, record.state, record.seconds, outcome.waited, record.started, record.error,
                       outcome.cached, outcome.skipped, outcome.where, record.origin)
