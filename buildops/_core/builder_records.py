"""What a builder knows of its builds, and the questions asked of it: a build's state and future, the per-op
statistics and history, how many builds run, which GPU builds are pending.

:class:`BuilderRecords` is the base of :class:`~.builder.Builder`. It holds the builder's lock and the tables that
lock guards: records by key and by future, the :class:`~.ledger.Ledger`, the counts of builds in flight and
running. The builder queues, runs, gives up and cancels builds; the bookkeeping here keeps the tables in step as it
does, and every method ending in ``_locked`` is called with the lock held.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Hashable
from typing import Any

from .._runtime import gil
from .build import Build, BuildRecord, BuildState, OpStats, Record
from .ledger import Ledger
from .watchdog import stuck_gpu_builds

__all__ = ["BuilderRecords"]


class BuilderRecords:
    """A builder's records under its lock, with the read-only queries over them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[Hashable, Record] = {}
        self._by_future: dict[concurrent.futures.Future[Any], Record] = {}  # the same records, for expedite()
        self._ledger = Ledger()
        self._busy = 0
        self._in_flight = 0  # records queued or building

    # -- keeping the records ----------------------------------------------------------------------------------

    def _add_locked(self, record: Record) -> None:
        """A new record, found by its key and its future; it belongs to the history from now on."""
        self._records[record.build.key] = record
        self._ledger.made(record)
        self._by_future[record.future] = record

    def _count_in_locked(self) -> None:
        """Count a build about to be queued into those in flight; the first holds the GIL's short switch interval
        (a bad setting raises with nothing counted)."""
        if self._in_flight == 0:
            gil.hold()
        self._in_flight += 1

    def _count_out_locked(self) -> None:
        """Count a build out of those in flight; the last lets go of the GIL's short switch interval."""
        self._in_flight -= 1
        if self._in_flight == 0:
            gil.release()

    def _settle_locked(self, record: Record) -> None:
        """Count ``record`` out of the builds in flight, once."""
        if record.settled:
            return
        record.settled = True
        self._count_out_locked()

    def _cancelled_locked(self, record: Record) -> None:
        """Count a record cancelled before it ran, and forget its key, which may be queued again."""
        record.state = BuildState.CANCELLED
        self._ledger.of(record.build.op).cancelled += 1
        if self._records.get(record.build.key) is record:
            del self._records[record.build.key]

    def _done_locked(self, key: Hashable) -> bool:
        # ``settled``, not ``future.done()``: a build is settled, and the serial worker woken, just before its
        # future gets its result.
        record = self._records.get(key)
        return record is None or record.settled or record.future.cancelled()

    # -- looking ----------------------------------------------------------------------------------------------

    def state(self, key: Hashable) -> BuildState | None:
        """The state of the build with this key, or None if it was never submitted (or was cancelled)."""
        with self._lock:
            record = self._records.get(key)
            return record.state if record is not None else None

    def future(self, key: Hashable) -> concurrent.futures.Future[Any] | None:
        """The future of the build with this key, or None if it was never submitted (or was cancelled)."""
        with self._lock:
            record = self._records.get(key)
            return record.future if record is not None else None

    def stats(self) -> dict[str, OpStats]:
        """A copy of the per-op statistics."""
        with self._lock:
            return self._ledger.stats()

    def history(self) -> list[BuildRecord]:
        """Every build submitted, in order."""
        with self._lock:
            return self._ledger.history()

    def snapshot(self) -> tuple[dict[str, OpStats], list[BuildRecord]]:
        """:meth:`stats` and :meth:`history` at one instant, so that a report's counts agree with each other."""
        with self._lock:
            return self._ledger.stats(), self._ledger.history()

    @property
    def busy(self) -> int:
        """How many builds' runs are running now, those given up as timed out included."""
        with self._lock:
            return self._busy

    def gpu_pending(self) -> list[Build]:
        """The GPU builds queued or running now, and those given up as timed out whose runs still run (of any
        builder: one shut down since too)."""
        with self._lock:
            # A queued build whose owner cancelled its future never runs: join() does not wait for it either.
            pending = [r.build for r in self._records.values()
                       if r.build.uses_gpu and (r.state is BuildState.BUILDING
                                                or r.state is BuildState.QUEUED and not r.future.cancelled())]
        return pending + [b for b in stuck_gpu_builds() if b not in pending]
