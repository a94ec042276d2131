"""The builder: one per process, a queue of compile-only builds and the worker threads that run them.

Concurrency model:
  * One lock guards the builder's tables (records by key, per-op statistics: :mod:`.builder_records`, with the
    read-only queries over them). Nothing is built while it is held.
  * ``submit`` dedups by build key: a key queued, building or built returns the future it already has; a key
    whose build was cancelled may be submitted again.
  * Workers take records off a queue of two lanes (:mod:`.lanes`): urgent, then first in, first out. Builds
    marked ``serial`` go to a :class:`~.serial.SerialQueue` with a worker of its own.
  * Serving goes first: ``wait_for`` (an op's call outside a pass) expedites the builds it waits for that are still
    queued, ahead of every build not expedited, a serial one with the normal builds it runs after; builds that no
    one waits for run behind them, and go on after the pass that queued them ends (only a pass that raises or is
    interrupted while its end waits, or ``shutdown``, cancels them). In a worker pool, a build expedited while it
    waits for a worker process goes first too (:mod:`buildops._runtime.turns`). Passes and ``join`` expedite
    nothing.
  * A shared build is claimed across the node first (:mod:`.claims`); one another process holds goes to the back
    of its lane. Then, with a build store, across the cluster (:mod:`.sharing`): fetched if stored, else claimed
    there; one another node holds goes to the back of its lane too.
  * A record whose future was cancelled before a worker reached it is skipped
    (``Future.set_running_or_notify_cancel``), so a cancelled build never runs.
  * A build that raises is marked failed, logged once with its traceback and counted; its future holds the
    exception, which buildops never re-raises into an op's call: the op compiles on first use instead.
  * A build that runs longer than ``BUILDOPS_BUILD_TIMEOUT`` is given up (:mod:`.watchdog`), and a worker starts
    in place of the one still inside it (:mod:`.builder_threads`).
  * While it has builds queued or running, the builder holds the GIL's short switch interval
    (:mod:`buildops._runtime.gil`).
  * After ``os.fork`` the child forgets the parent's builder (its threads do not exist there, its locks may be
    held) and creates a fresh one when first needed (:mod:`.default`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._config import settings
from .._runtime.node import node_claims
from .._runtime.turns import urgency
from . import extensions
from .build import Build, BuildState, BuildTimeoutError, Outcome, Record, outcome_of
from .builder_records import BuilderRecords
from .builder_threads import BuilderThreads, join_threads
from .claims import claim, release
from .lanes import Lanes, SerialQueue
from .sharing import StoreCounts, StoreSharing, store_sharing
from .waiting import wait_until_done
from .watchdog import Watchdog, abandon, stuck

__all__ = ["Builder"]

logger = logging.getLogger("buildops")

# The owner of a build started as its launch was recorded, until its listing takes it (Builder.start_early)
_EARLY = object()

# How long shutdown waits for the watchdog's thread to end once it watches nothing: woken, it ends at once.
WATCHDOG_END_SECONDS = 1.0


class _WaitingOp(Protocol):
    """What an op's calls may wait for on this builder's builds (:class:`.pending.PendingBuilds`)."""

    def forget_pending(self) -> None: ...


class Builder(BuilderRecords):
    """Runs builds on worker threads, deduplicated by key. See the module docstring for the concurrency model; the
    records it keeps, and the queries over them, are in its base (:mod:`.builder_records`)."""

    def __init__(self, threads: int | None = None) -> None:
        super().__init__()
        self._queue_changed = threading.Condition(self._lock)  # a normal build queued, or a worker to stop
        self._queue: Lanes[Record] = Lanes(self._queue_changed)
        self._serial_changed = threading.Condition(self._lock)  # a serial build queued, a build done, or closing
        self._serial: SerialQueue[Record] = SerialQueue(self._serial_changed, self._done_locked,
                                                          lambda: self._closed)
        self._threads = BuilderThreads(threads if threads is not None else settings.threads, self._work)
        self._closed = False
        self._claims = node_claims()
        self._sharing = store_sharing()
        self._watch_changed = threading.Condition(self._lock)  # a deadline set, a run ended, or closing
        self._watchdog: Watchdog[Record] = Watchdog(self._watch_changed, self._give_up_locked, self._after_give_up,
                                                     lambda: self._closed)
        self.waiting_ops: set[_WaitingOp] = set()  # ops with calls that may wait on builds; forgotten after a fork

    # -- submitting -------------------------------------------------------------------------------------------

    def submit(self, build: Build, owner: object = None) -> concurrent.futures.Future[Any]:
        """Queue ``build`` unless its key is already queued, building or built; return the key's future."""
        return self._submit(build, owner, listed=True)

    def start_early(self, build: Build) -> None:
        """Queue ``build`` ahead of its listing: a replay recorded its launch and goes on. It counts as listed
        now; the listing's :meth:`submit` then takes the record as its own, counting nothing more. A listing that
        never comes (its replay failed) leaves a build that runs and that no one waits for."""
        self._submit(build, _EARLY, listed=False)

    def _submit(self, build: Build, owner: object, listed: bool) -> concurrent.futures.Future[Any]:
        timeout = settings.build_timeout  # here: a bad value raises to the caller, with nothing queued
        with self._lock:
            if self._closed:
                raise RuntimeError("buildops: this builder was shut down; submit to the current one "
                                   "(buildops._core.default.default_builder())")
            stats = self._ledger.of(build.op)
            record = self._records.get(build.key)
            if record is not None and record.state is BuildState.QUEUED and record.future.cancelled():
                # Cancelled by its owner through the future, not yet skipped by a worker: it never runs, so the key
                # is queued again (the worker that reaches the old record leaves the new one alone).
                del self._records[build.key]
                record = None
            if record is not None:
                if not listed:
                    return record.future
                if _EARLY in record.owners and build.op in record.ops:  # its own listing, counted when it started
                    record.owners.discard(_EARLY)
                else:
                    stats.listed += 1
                    stats.shared += 1
                record.owners.add(owner)
                record.ops.add(build.op)
                return record.future
            stats.listed += 1
            self._count_in_locked()  # before the record exists: a bad setting raises with nothing queued
            try:
                if build.uses_gpu:
                    extensions.first_gpu_build()
                self._threads.start_for_locked(build.serial)
            except BaseException:  # nothing was queued: no longer in flight
                self._count_out_locked()
                raise
            record = Record(build, concurrent.futures.Future(), {owner}, {build.op}, timeout=timeout)
            self._add_locked(record)
            if build.serial:
                self._serial.put_locked(record)
            else:
                self._queue.put_locked(record)
            return record.future

    def _work(self, serial: bool) -> None:
        """A worker thread's loop, on the serial queue or the normal one."""
        queue = self._serial if serial else self._queue
        take, put_back = queue.take, queue.put
        while True:
            record = take()
            if record is None:
                return
            if (self._claims is not None and record.build.shared and not record.future.cancelled()
                    and not claim(self._claims, record)):
                put_back(record)  # another process of the node builds it: something else first
                continue
            sharing = self._sharing if record.build.shared and not record.future.cancelled() else None
            if sharing is not None and not sharing.before_run(record):
                self._release_claim(record)
                put_back(record)  # another node builds it: something else first
                continue
            try:
                self._run(record, sharing)
            finally:
                if sharing is not None:
                    sharing.release(record)
                self._release_claim(record)
            if record.given_up:  # another worker took this one's place while it was stuck in the build
                return

    def _release_claim(self, record: Record) -> None:
        """Release the record's node claim once, whichever of its worker and the watchdog comes first."""
        with self._lock:
            claim, record.claim = record.claim, None
        release(claim, record.build)

    def _run(self, record: Record, sharing: StoreSharing | None = None) -> None:
        if not record.future.set_running_or_notify_cancel():
            with self._lock:  # cancelled while queued: by cancel or shutdown, or by its owner through the future
                if record.state is not BuildState.CANCELLED:  # its owner: cancel and shutdown did this already
                    self._cancelled_locked(record)
                self._settle_locked(record)
                self._serial_changed.notify_all()
            return
        start = time.perf_counter()
        with self._lock:
            record.state = BuildState.BUILDING
            record.started = start
            record.thread = threading.current_thread()
            self._busy += 1
            if record.timeout > 0:
                record.deadline = time.monotonic() + record.timeout
                self._watchdog.watch_locked(record)
        try:
            with urgency(lambda: record.urgent):
                outcome = outcome_of(record.build.run())
        except BaseException as exc:  # noqa: BLE001 - a failed build's op compiles on first use; _finish logs it
            if self._finish(record, time.perf_counter() - start, exc):
                record.future.set_exception(exc)
        else:
            if sharing is not None:  # stored before anyone learns it is built: a process may end once it is
                sharing.after_build(record)
            if self._finish(record, time.perf_counter() - start, None, outcome):
                record.future.set_result(outcome.value)

    def _finish(self, record: Record, seconds: float, error: BaseException | None,
                outcome: Outcome | None = None) -> bool:
        """Count the run's outcome; False if the build was given up meanwhile (its future has its outcome)."""
        with self._lock:
            self._busy -= 1
            self._watchdog.unwatch_locked(record)
            if record.given_up:
                stuck.discard(record)
                logger.info("buildops: build %s of op %s, given up as timed out, ended after %.1f s (%s); its "
                            "outcome is dropped", record.build.describe(), record.build.op, seconds,
                            "failed" if error is not None else "built")
                return False
            self._settle_locked(record)
            self._serial_changed.notify_all()  # a serial build may have been waiting for this one
            record.seconds = seconds
            record.error = error
            record.outcome = outcome
            record.state = BuildState.FAILED if error is not None else BuildState.BUILT
            self._ledger.ran(record, seconds, failed=error is not None)
        if error is not None:
            logger.warning("buildops: build %s of op %s failed after %.2f s; the op will compile it on first use",
                           record.build.describe(), record.build.op, seconds, exc_info=error)
        return True

    # -- giving up on builds that run too long (the watchdog calls these) ----------------------------------

    def _give_up_locked(self, record: Record) -> BuildTimeoutError:
        """Mark a build that ran past its deadline failed; :meth:`_after_give_up` sets its future."""
        seconds = time.perf_counter() - (record.started or 0.0)
        error = BuildTimeoutError(f"buildops: build {record.build.describe()} of op {record.build.op} ran "
                                  f"{seconds:.1f} s, past BUILDOPS_BUILD_TIMEOUT={record.timeout:g}; given up")
        stuck.add(record)  # still running: a GPU one still refuses graph capture
        record.given_up = True
        self._settle_locked(record)
        self._serial_changed.notify_all()
        record.seconds, record.error, record.state = seconds, error, BuildState.FAILED
        self._ledger.ran(record, seconds, failed=True)
        # A worker in place of the stuck one, which ends once its run returns, if ever.
        needed = bool(self._serial.pending) if record.build.serial else not self._closed
        self._threads.replace_locked(record.thread, record.build.serial, needed)
        return error

    def _after_give_up(self, record: Record, error: BaseException) -> None:
        logger.warning("%s; its op will compile it on first use", error)
        record.future.set_exception(error)
        self._release_claim(record)  # other processes of the node build the key now
        abandon(record.build)

    # -- cancelling -------------------------------------------------------------------------------------------

    def cancel(self, futures: Iterable[concurrent.futures.Future[Any]], releases: Callable[[object], bool]) -> int:
        """Drop the owners for which ``releases(owner)`` is true from these builds; cancel the builds that no
        owner still wants and no worker has started. Returns how many were cancelled; a running build finishes.
        """
        wanted = set(futures)
        cancelled = 0
        with self._lock:
            for record in list(self._records.values()):
                if record.future not in wanted:
                    continue
                record.owners = {o for o in record.owners if not releases(o)}
                if not record.owners and record.future.cancel():
                    self._settle_locked(record)
                    self._cancelled_locked(record)
                    cancelled += 1
            self._serial_changed.notify_all()  # a cancelled build counts as done for serial builds after it
        return cancelled

    # -- serving first ----------------------------------------------------------------------------------------

    def expedite(self, futures: Iterable[concurrent.futures.Future[Any]]) -> int:
        """Move the builds of these futures that are still queued ahead of every build not expedited, a serial one
        with the normal builds it runs after (``Build.after``): what the caller is about to wait for, and only that.
        Returns how many moved. A build running or done stays as it is, as does a cancelled one (a worker skips
        it); one running that waits for a worker process goes first there."""
        with self._lock:
            found = (self._by_future.get(f) for f in dict.fromkeys(futures))  # once each, in the caller's order
            records = [r for r in found if r is not None and not r.settled and not r.future.cancelled()]
            needed = [self._records.get(key) for r in records
                      if r.build.serial and r.state is BuildState.QUEUED for key in r.build.after]
            normal = [r for r in records if not r.build.serial]
            normal += [r for r in needed if r is not None and not r.build.serial and not r.settled
                       and not r.future.cancelled()]
            moved = sum(self._serial.expedite_locked(r) for r in records if r.build.serial)
            return moved + self._queue.expedite_locked(normal)

    # -- waiting ----------------------------------------------------------------------------------------------

    def wait(self, select: Callable[[Record], bool], timeout: float | None = None, what: str = "builds") -> bool:
        """Wait until no selected record is queued or building, records submitted meanwhile included; progress
        shows after ``BUILDOPS_PROGRESS_AFTER`` seconds. Returns False if ``timeout`` passed first."""
        def selected() -> list[concurrent.futures.Future[Any]]:
            with self._lock:
                return [r.future for r in self._records.values() if select(r)]
        return wait_until_done(selected, timeout, what)

    def join(self, timeout: float | None = None, gpu_only: bool = False, op: str | None = None) -> bool:
        """Wait for all builds, only those that use the GPU, or only one op's (by name or name prefix)."""
        def select(record: Record) -> bool:
            if gpu_only and not record.build.uses_gpu:
                return False
            return op is None or any(listed.startswith(op) for listed in record.ops)
        what = "GPU builds" if gpu_only else f"builds of {op}" if op else "builds"
        return self.wait(select, timeout, what)

    def wait_for(self, futures: Iterable[concurrent.futures.Future[Any]], op: str,
                 timeout: float | None = None) -> bool:
        """Wait for these futures (an op's call waiting on its builds), expedited first; the time counts as
        ``op``'s wait."""
        wanted = set(futures)
        start = time.perf_counter()
        try:
            self.expedite(wanted)
            return self.wait(lambda r: r.future in wanted, timeout, f"builds for {op}")
        finally:
            with self._lock:
                self._ledger.of(op).wait_seconds += time.perf_counter() - start

    # -- looking (the queries over its records are in BuilderRecords) -----------------------------------------

    def store_counts(self) -> StoreCounts | None:
        """What this builder's builds took from and gave to the build store; None without one."""
        return None if self._sharing is None else self._sharing.counts()

    @property
    def closed(self) -> bool:
        """Shut down: it takes no more builds."""
        return self._closed

    @property
    def workers(self) -> int:
        with self._lock:
            return len(self._threads.normal_locked)

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Cancel queued builds and stop the workers; with ``wait``, return once running builds finished
        (or ``timeout`` seconds passed: workers are daemon threads and a stuck build cannot keep the process)."""
        with self._lock:
            self._closed = True
            for record in list(self._records.values()):
                if record.future.cancel():
                    self._settle_locked(record)
                    self._cancelled_locked(record)
            workers = self._threads.normal_locked
            for _ in workers:
                self._queue.put_locked(None)
            serial = self._threads.serial_locked
            self._serial_changed.notify_all()  # it stops once its list is empty
            self._watch_changed.notify_all()  # the watchdog ends once no run it watches is left
        if serial is not None:
            workers.append(serial)
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            join_threads(workers, deadline)
            if not self._watchdog.running:  # it watches nothing more and is ending: no thread outlives the builder
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                self._watchdog.join(WATCHDOG_END_SECONDS if left is None else min(WATCHDOG_END_SECONDS, left))
            if self._sharing is not None:  # after the workers: each released its own builds' claims
                self._sharing.close()

