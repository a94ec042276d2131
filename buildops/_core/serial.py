"""The queue of serial builds: one at a time, each once the normal builds it names (``Build.after``) are done.

Serial builds (autotuning, which times kernels on the GPU) run on a worker of their own, one at a time beside the
compiles and without holding a compile worker. The worker takes the first serial build, in submission order, whose
``after`` builds are done, so it never idles on one build's compiles while another could run; one that waited
``AFTER_WAIT_SECONDS`` runs regardless, and copes with what is missing. A serial build may wait for normal
builds, never the reverse (docs/decisions/0014-autotuning-in-the-build.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["AFTER_WAIT_SECONDS", "SerialQueue"]

# A serial build whose ``after`` builds are not all done runs anyway once it has waited this long (a compile that
# another process of the node holds a claim on can take long).
AFTER_WAIT_SECONDS = 120.0
# How often a waiting worker looks again on its own: an owner cancelling a future itself notifies no one.
RECHECK_SECONDS = 1.0


class _Queued(Protocol):
    queued: float
    build: Any
    future: Any


Q = TypeVar("Q", bound=_Queued)


class SerialQueue(Generic[Q]):
    """Serial records waiting for their turn. It shares its owner's lock through ``changed`` (a condition on that
    lock), which the owner notifies when a build is done or cancelled, or it closes; ``done_locked(key)`` says
    whether a key counts as done (never submitted, cancelled or settled)."""

    def __init__(self, changed: threading.Condition, done_locked: Callable[[Hashable], bool],
                 closed: Callable[[], bool]) -> None:
        self._changed, self._done_locked, self._closed = changed, done_locked, closed
        self.pending: list[Q] = []  # in submission order, under the lock

    def put_locked(self, record: Q) -> None:
        record.queued = time.monotonic()
        self.pending.append(record)
        self._changed.notify_all()

    def put(self, record: Q) -> None:
        with self._changed:
            self.put_locked(record)

    def take(self) -> Q | None:
        """The serial record to run next, or None once the owner is closed and nothing is pending."""
        with self._changed:
            while True:
                if self._closed() and not self.pending:
                    return None
                for record in self.pending:
                    if record.future.cancelled() or all(self._done_locked(key) for key in record.build.after):
                        break
                else:
                    if not self.pending:
                        self._changed.wait()  # until a serial build is queued, or the owner closes
                        continue
                    oldest = self.pending[0]
                    patience = AFTER_WAIT_SECONDS - (time.monotonic() - oldest.queued)
                    if patience > 0:
                        self._changed.wait(timeout=min(patience, RECHECK_SECONDS))
                        continue
                    record = oldest
                self.pending.remove(record)
                return record
