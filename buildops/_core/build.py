"""What a build is: the job (:class:`Build`), its states, and what the builder records of it (:class:`Record`, and
the copies reports get)."""

from __future__ import annotations

import concurrent.futures
import enum
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Artifact", "Build", "BuildRecord", "BuildState", "BuildTimeoutError", "OpStats", "Outcome", "outcome_of"]


class Artifact(Protocol):
    """What a build leaves in its library's own cache, so that the nodes of a cluster can share it through the
    build store (``BUILDOPS_STORE``, :mod:`buildops._core.sharing`). One object per build.

    Contract for a backend:
      * ``identity()`` names everything that makes the artifact valid (library versions, target, compiler,
        options, the relevant environment) and nothing of where things are installed: two nodes with equal
        identities build interchangeable artifacts, two with different versions never share one. 64 hex
        characters (a sha256). Called on a builder thread before the run and again after it: the first call may be
        slow (it may hash an install), later ones must be cheap (keep it).
      * ``known_locally()`` is true when the local cache already holds what an earlier fetch or upload of this
        identity placed there, so the store need not be asked.
      * ``install(files)`` puts fetched files (relative path -> bytes, already verified) into the local cache
        before the run, atomically per entry (a reader never sees half an entry), and replaces no entry that is
        there; the run then finds them cached. Files it cannot place are left out (the run compiles them).
      * ``collect()`` is called after a run that built: the files to share (relative path -> bytes), with no
        absolute path of this node that the library follows to load them (debug information may keep one), or
        None when there is nothing to share. It may remember that the
        local cache holds them (``known_locally``).
      * ``collect_grown()`` (optional) is called after a run whose artifact was fetched: the fetched files and
        what the run compiled beyond them, stored again under the same identity, or None when it compiled nothing.
        For artifacts that can lack an entry their first node found in its cache (DeepGEMM's, which take what
        appeared while the run ran).
      * ``rejects(files)`` (optional) is called on fetched files that passed the store's own verification (their
        recorded hashes), before ``install``: why this node must not use them (a binary that is not whole, one
        built for another target), or None. A rejected artifact counts as bad: built here and replaced in the
        store.
      * None of them raises for a missing or foreign cache entry; any exception leaves the build to run unshared.
    """

    def identity(self) -> str: ...

    def known_locally(self) -> bool: ...

    def install(self, files: Mapping[str, bytes]) -> None: ...

    def collect(self) -> dict[str, bytes] | None: ...


@dataclass(frozen=True, slots=True)
class Build:
    """One compile-only job.

    Contract for whoever makes builds (listers, library backends):
      * ``key`` names everything that changes the artifact (kernel, specialization, constexprs, target, options):
        two builds with equal keys must produce the same artifact, because only the first one runs.
      * ``run`` compiles into the library's own cache and never launches work on a user's tensors; it may be
        called on any worker thread; its return value is kept on the future; an exception marks the build failed.
      * ``uses_gpu`` is true when ``run`` allocates GPU memory or launches GPU work, so that
        ``join(gpu_only=True)`` waits for it.
      * ``loads_only`` is true when the only GPU step of a ``uses_gpu`` build is loading what it compiled (a
        module load: no work launched, no memory taken beyond the module's). A CUDA graph capture still waits for
        it; the startup recipe's ready does not (:func:`buildops.startup.rehearse_then_load`).
      * ``run`` returns an :class:`Outcome` saying what it did (found cached, skipped, where, time spent waiting
        for other builds), or any other value, which says nothing more (``Outcome(value=...)``).
      * ``serial`` builds time GPU work (autotuning) one at a time. They only refine: the library runs without
        their result meanwhile, so a serving call never waits for one, and a start is ready without those of the
        shapes its rehearsal did not call.
      * ``after`` (serial builds only) names the keys of normal builds this one needs done: the serial worker
        runs it once they are (keys never submitted, or cancelled, count as done). ``run`` need not wait itself.
      * ``abandon`` (optional) is called once, on a thread of its own and under no lock, when the build is given
        up as timed out, to stop what can be stopped (a worker process stuck in it), so that ``run`` returns or
        raises soon. Its outcome is dropped either way.
    """

    op: str
    key: Hashable
    run: Callable[[], Any]
    uses_gpu: bool = False
    loads_only: bool = False  # see the contract
    label: str = ""
    library: str = ""  # "triton", "flashinfer", ...: what the report counts its coverage by
    shared: bool = True  # built once per node: other processes wait, then find it in the library's disk cache
    serial: bool = False  # one at a time, on the builder's serial worker (builds that time GPU work); see the contract
    after: tuple[Hashable, ...] = ()  # serial builds: keys of the normal builds to wait for (see the contract)
    artifact: Artifact | None = None  # shared through the build store, where one is set (see Artifact)
    abandon: Callable[[], None] | None = None  # stops a run given up as timed out (see the contract)

    def __post_init__(self) -> None:
        if self.after and not self.serial:
            raise ValueError(f"build {self.describe()} of op {self.op}: only serial builds may name builds to run "
                             f"after (a normal build waiting for others could hold every worker)")

    def describe(self) -> str:
        if self.label:
            return self.label
        try:
            return repr(self.key)
        except Exception:  # noqa: BLE001 - a key whose repr raises still gets logged and given up
            return f"<{type(self.key).__name__} key>"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a build's run says of itself when it returns (the :class:`Build` contract).

    ``value`` is kept on the build's future. ``cached``: True if the artifact was already in the library's cache
    (disk or memory) and nothing compiled, False if the run compiled it, None if it cannot tell; reports split
    prebuilt builds by it. ``skipped``: why it had nothing to compile (Triton's interpreter runs kernels
    uncompiled), or None; a skipped build counts as skipped, not prebuilt. ``where``: where it compiled and why,
    when not where its library's builds go by default ("this process (...)" for a Triton kernel that could not go
    to a worker process), or None; reports count builds by it. ``waited``: the seconds it spent waiting for other
    builds (an autotuning for its compiles), which reports count apart from its own time.
    """

    value: Any = None
    cached: bool | None = None
    skipped: str | None = None
    where: str | None = None
    waited: float = 0.0


def outcome_of(returned: Any) -> Outcome:
    """A run's return value as an :class:`Outcome` (a plain value says nothing more than itself)."""
    return returned if isinstance(returned, Outcome) else Outcome(value=returned)


class BuildTimeoutError(RuntimeError):
    """A build ran longer than ``BUILDOPS_BUILD_TIMEOUT`` and was given up (its future's exception). Not a
    ``TimeoutError``: a wait that ran out of time is not a build that did."""


class BuildState(enum.Enum):
    """Where a build is: queued, building, built, failed (or given up as timed out), or cancelled."""

    QUEUED = "queued"
    BUILDING = "building"
    BUILT = "built"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class OpStats:
    """What one op asked of the builder. Seconds are wall-clock seconds summed over builds or waits."""

    listed: int = 0          # builds the op listed, shared ones included
    shared: int = 0          # of those, builds whose key was already known (queued, built, ... by any op)
    built: int = 0
    failed: int = 0
    cancelled: int = 0
    build_seconds: float = 0.0
    wait_seconds: float = 0.0  # time calls of the op spent waiting for builds outside a pass


@dataclass(frozen=True)
class BuildRecord:
    """One build as the builder saw it: ``seconds`` its run took (0 until it ends), ``waited`` of those spent
    waiting for other builds, ``started`` the ``time.perf_counter()`` at which its run began (None if it never
    ran). For a built build, ``cached``, ``skipped`` and ``where`` are what its run's :class:`Outcome` said;
    ``origin`` "store" where its artifact came from the build store, else None."""

    build: Build
    state: BuildState
    seconds: float
    waited: float
    started: float | None
    error: BaseException | None
    cached: bool | None = None
    skipped: str | None = None
    where: str | None = None
    origin: str | None = None


@dataclass(eq=False)
class Record:
    """A build as the builder keeps it, changed under the builder's lock; :class:`BuildRecord` is the copy reports
    get."""

    build: Build
    future: concurrent.futures.Future[Any]
    owners: set[object] = field(default_factory=set)  # passes that still want it; None: submitted outside a pass
    ops: set[str] = field(default_factory=set)  # every op that listed it (join(op=...) waits for shared builds too)
    state: BuildState = BuildState.QUEUED
    seconds: float = 0.0
    started: float | None = None
    error: BaseException | None = None
    settled: bool = False  # finished or cancelled: no longer counted in flight
    queued: float = 0.0  # time.monotonic() when it last joined a queue (serial builds)
    urgent: bool = False  # a serving call waits for it: it goes ahead of the builds no one waits for
    timeout: float = 0.0  # BUILDOPS_BUILD_TIMEOUT when it was submitted (0: none)
    deadline: float | None = None  # time.monotonic() at which it is given up, while it runs with a timeout
    thread: threading.Thread | None = None  # the worker running it
    given_up: bool = False  # timed out: its run's outcome, whenever it comes, is dropped
    claim: Any = None  # its claim on the key across the node, while it is built here
    refused_since: float | None = None  # time.monotonic() when another process of the node first held its key
    lease: Any = None  # its claim on the key in the build store, while it is built here
    held_elsewhere_since: float | None = None  # time.monotonic() when another node first held its key in the store
    outwaited: bool = False  # built here after another node held its key past BUILDOPS_BUILD_TIMEOUT
    origin: str | None = None  # "store": its artifact was fetched from the build store
    outcome: Outcome | None = None  # what its run returned, once it returned
