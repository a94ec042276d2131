"""Build passes: the ``with`` blocks inside which ops list builds instead of running.

The current pass lives in a ``ContextVar``, so a pass covers the thread (or task) that entered it and nothing else.
Passes nest: every pass remembers the builds queued inside it, but only the outermost decides whether to join at
its end. A body that raises (``KeyboardInterrupt`` included) cancels the builds queued inside that pass that no
other pass wants and no worker has started, and the exception propagates; so does an exception (a Ctrl-C) raised
while the end of a ``build_pass`` waits for its builds. A cancelled future is done: an op's call no longer waits
for it.

Settings: a pass's start reads every ``BUILDOPS_*`` setting, so that a bad value raises :class:`ConfigError` there,
before anything is listed, and not in a build or a serving call later.

Coverage: an op whose first call with some signature listed no build at any swept shape has nothing built for that
signature. The outermost pass names such ops in one warning at its end, and keeps them for the report
(:func:`listed_nothing`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._config import settings
from . import late
from .build import Build
from .builder import Builder
from .default import current_builder, default_builder
from .state import core
from .sweeps import Sweep, list_later

__all__ = ["BuildPass", "ListedNothing", "active", "build_pass", "current_pass", "in_pass", "listed_nothing",
           "pass_context", "rehearsal"]

logger = logging.getLogger("buildops")

pass_context: contextvars.ContextVar[BuildPass | None] = contextvars.ContextVar("buildops_pass", default=None)
# Set (True) in a context from a pass's start to its end, as pass_context is, and unset elsewhere: a decorated op's
# wrapper asks it first, in C (declaring.wrap). A pass's own truth is the subclass's to change (a __len__); this is not.
in_pass: contextvars.ContextVar[bool] = contextvars.ContextVar("buildops_in_pass")


@dataclass(frozen=True)
class ListedNothing:
    """An op that listed no build, at any swept shape, for ``signatures`` of the call signatures it was first
    called with in the outermost pass ``pass_name``: nothing was built for those calls."""

    op: str
    pass_name: str
    signatures: int

    def describe(self) -> str:
        return f"op {self.op} listed nothing in pass {self.pass_name!r} for {self.signatures} call signature(s)"


def listed_nothing_fixes(op: str) -> str:
    """Why an op lists nothing, and what to do: the end of the warning a pass gives."""
    return ("its kernels, if it has any, compile on first use. Likely: its host code launched nothing that buildops "
            "records on this path (a branch the dummy inputs skip, a torch custom op implemented in C++ "
            "or CUDA, or a library without a launch recorder), or its lister returned no builds. Make the "
            f"dummy inputs take the path that launches, register a lister that returns its builds "
            f"(@{op.split('.')[-1]}.lister), or leave undecorated an op that has nothing to build")


def listed_nothing() -> list[ListedNothing]:
    """Every op that listed nothing in an outermost pass ended so far (one entry per op and pass), in order."""
    with core.listed_nothing_lock:
        return list(core.listed_nothing)


def current_pass() -> BuildPass | None:
    """The innermost active pass of this thread or task, or None."""
    return active(pass_context.get())


def active(node: BuildPass | None) -> BuildPass | None:
    """``node`` if it is still active, else its innermost enclosing pass that is. An asyncio task (or a context
    copied by hand) made inside a pass keeps that pass in its copy of the context after the pass has ended."""
    while node is not None and not node._active:
        node = node.parent
    return node


class BuildPass:
    """A block in which decorated ops list their builds and return placeholder outputs.

    Use :func:`build_pass` (joins at its end) or :func:`rehearsal` (does not). Subclasses may override
    :meth:`take` to do something other than queueing the builds (``buildops.testing`` records them).
    """

    #: whether the end of this pass (as the outermost) starts late-compile detection
    arms_late_compiles = True
    #: whether this pass remembers its own first calls rather than share the enclosing passes' memory: a test's
    #: recorder inside a real pass must see every call, and must not keep the real pass from queueing them
    lists_apart = False
    #: whether first calls in this pass may leave the rest of a sweep to be listed after its body (:mod:`.sweeps`):
    #: a recorder lists it all at once, for the test that reads it
    lists_sweep_later = True

    def __init__(self, name: str, join_at_exit: bool) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a build pass needs a non-empty name, got {name!r}")
        self.name = name
        self.join_at_exit = join_at_exit
        self.parent: BuildPass | None = None
        self.futures: list[concurrent.futures.Future] = []
        self.called: set[concurrent.futures.Future] = set()  # of those, the builds of shapes calls were made at
        self._seen: set[tuple[Any, Hashable]] = set()
        # The root's: the futures listed per (op, signature, swept shape as sorted items), for note_called
        self._by_shape: dict[tuple[str, Hashable, tuple], list[concurrent.futures.Future]] = {}
        self._first: set[tuple[Any, Hashable]] = set()  # first calls made inside this pass (its nested ones too)
        # The outermost pass's: per (op, signature) taken in it or nested passes, whether any build was listed
        self._listed: dict[tuple[str, Hashable], bool] = {}
        # The outermost pass's: sweeps whose rest is listed at its end, then while they list
        self._sweeps: list[Sweep] = []
        self._builder: Builder | None = None
        self._token: contextvars.Token[BuildPass | None] | None = None
        self._in_pass_token: contextvars.Token[bool] | None = None
        self._active = False
        self._started = 0.0

    @property
    def root(self) -> BuildPass:
        """The pass whose memory of first calls this one shares: the outermost, or the nearest that lists apart."""
        node = self
        while node.parent is not None and not node.lists_apart:
            node = node.parent
        return node

    def encloses(self, other: object) -> bool:
        """True if ``other`` is this pass or a pass nested inside it."""
        node = other if isinstance(other, BuildPass) else None
        while node is not None:
            if node is self:
                return True
            node = node.parent
        return False

    def first_call(self, op: object, signature: Hashable) -> bool:
        """True the first time ``op`` is called with ``signature`` in this pass (nested passes included)."""
        seen = self.root._seen
        key = (op, signature)
        if key in seen:
            return False
        seen.add(key)
        self._first.add(key)
        return True

    def note_called(self, op: str, signature: Hashable, dims: Mapping[str, int]) -> None:
        """A call of ``op`` with ``signature`` was made at the shape ``dims``: if a first call's sweep listed that
        shape in this pass (or an enclosing one), its builds are among those :meth:`wait_for_called_shapes`
        waits for, and they go to the front of the builder's queue. A shape outside the sweep lists nothing."""
        futures = self.root._by_shape.get((op, signature, shape_key(dims)))
        if not futures:
            return
        node: BuildPass | None = self
        while node is not None:
            node.called.update(futures)
            node = node.parent
        builder = self._builder
        if builder is not None:
            builder.expedite(futures)

    @property
    def lists_later(self) -> bool:
        """Whether the rest of a first call's sweep may be listed after the body of the outermost pass."""
        root = self.root
        return root.lists_sweep_later and root.parent is None

    def list_later(self, sweep: Sweep) -> None:
        """Leave ``sweep`` (shapes of a first call made in this pass) to be listed after the outermost pass's body:
        at the end of a build pass, before it waits; after a rehearsal, on a background thread."""
        self.outermost._sweeps.append(sweep)

    def drop_sweeps(self) -> None:
        """List no more of the sweeps left for after this pass (a start that failed)."""
        for sweep in self.outermost._sweeps:
            sweep.drop()

    @property
    def outermost(self) -> BuildPass:
        """The pass that encloses this one and is enclosed by none (this one, if it is not nested)."""
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def take(self, op: str, signature: Hashable, dims: Mapping[str, int], builds: Iterable[Build]) -> list:
        """Queue the builds an op listed for one swept shape; return their futures.

        Called once per swept shape of each first call (an empty ``builds`` included), so that the outermost pass
        knows which call signatures listed nothing at all. A subclass that overrides it (a recorder) keeps no
        such count, and no futures for :meth:`note_called`.
        """
        builds = list(builds)
        builder = self._queueing_builder()
        if builder is None:
            return []
        listed = self.outermost._listed
        listed[(op, signature)] = listed.get((op, signature), False) or bool(builds)
        futures = [builder.submit(build, owner=self) for build in builds]
        self.root._by_shape[(op, signature, shape_key(dims))] = futures
        node: BuildPass | None = self
        while node is not None:  # every enclosing pass answers for what its body queued
            node.futures.extend(futures)
            node._builder = builder
            node = node.parent
        return futures

    def start_early(self, build: Build) -> None:
        """Start ``build`` as soon as a replay in this pass records its launch, before the replay's host code ends
        (:mod:`.early_starts`); the op's :meth:`take` of it then finds it queued."""
        builder = self._queueing_builder()
        if builder is not None:
            builder.start_early(build)

    def _queueing_builder(self) -> Builder | None:
        """The builder this pass queues into; None for a sweep listed after the pass and a shutdown, which no one
        waits on."""
        builder = self._builder
        if builder is not None and builder.closed and not self._active:
            return None
        if builder is None or builder.closed:  # buildops.shutdown() ran inside the pass: on with the new builder
            builder = default_builder()
        return builder

    def wait_for_called_shapes(self, timeout: float | None = None) -> bool:
        """Wait for the builds of the shapes this pass's calls were made at (each op's own call, not its sweep):
        what an engine calls first. The rest of the sweep goes on building. Returns False if ``timeout`` passed
        first.

        Args:
            timeout: seconds to wait at most (default: no limit).
        """
        builder = self._builder
        if builder is None or not self.called:
            return True
        wanted = set(self.called)
        return builder.wait(lambda r: r.future in wanted, timeout, what=f"builds of the shapes pass {self.name!r} "
                                                                            f"called")

    def __enter__(self) -> BuildPass:
        if self._active:
            raise RuntimeError(f"build pass {self.name!r} is already active; make a new one to nest")
        if not settings.enabled:  # BUILDOPS=0: a plain block
            return self
        settings.validate()  # every setting its builds, its end and the serving after it may read
        # Entered again (a retry after a body that raised): a new pass, listing from nothing.
        self.futures, self.called, self._seen, self._first, self._builder = [], set(), set(), set(), None
        self._by_shape = {}
        self._listed = {}
        self._sweeps = []
        self.parent = current_pass()
        self._in_pass_token = in_pass.set(True)
        self._token = pass_context.set(self)
        self._active = True
        self._started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._active:
            return
        self._active = False
        assert self._token is not None and self._in_pass_token is not None  # set with _active by __enter__
        pass_context.reset(self._token)
        in_pass.reset(self._in_pass_token)
        self._token = self._in_pass_token = None
        builder = self._builder
        if exc_type is not None:
            # Its builds are cancelled below: the calls that listed them are first calls again, for a retry in
            # an enclosing pass.
            self.root._seen.difference_update(self._first)
            for sweep in self.outermost._sweeps:
                if self.encloses(sweep.owner):
                    sweep.drop()
            self._cancel(builder, f"raised {exc_type.__name__}")
            return
        if self.parent is not None:
            self.parent._first.update(self._first)
            return
        self._report_listed_nothing()
        sweeps = [sweep for sweep in self._sweeps if not sweep.done.done()]
        if self.join_at_exit:  # listed here, while the shapes the body called build
            for sweep in sweeps:
                sweep.list_rest()
            builder = self._builder
        else:
            list_later(sweeps)
        if self.join_at_exit and builder is not None and builder is current_builder():
            wanted = set(self.futures)
            try:
                builder.wait(lambda r: r.future in wanted, what=f"builds of pass {self.name!r}")
            except BaseException as error:  # a Ctrl-C while it waits: no one wants the builds it waited for
                self._cancel(builder, f"was interrupted by {type(error).__name__} while waiting for its builds")
                raise
        if self.arms_late_compiles:
            late.arm()  # from now on, a kernel compiled on first use is a gap in what the passes covered
        futures = set(self.futures)
        failed = sum(1 for f in futures if f.done() and not f.cancelled() and f.exception() is not None)
        building = sum(1 for f in futures if not f.done())
        listing = sum(1 for sweep in sweeps if not sweep.done.done())
        logger.info("buildops: pass %r done in %.2f s (%d build(s) queued%s%s%s)", self.name,
                    time.perf_counter() - self._started, len(futures),
                    f", {failed} failed or given up: their ops compile on first use" if failed else "",
                    f", {building} still building" if building else "",
                    f", the rest of {listing} sweep(s) listing behind" if listing else "")

    def _cancel(self, builder: Builder | None, why: str) -> None:
        """Cancel the queued builds that only this pass and the passes it encloses wanted, and log it."""
        if builder is None or not self.futures:
            return
        cancelled = builder.cancel(self.futures, releases=self.encloses)
        logger.info("buildops: pass %r %s; cancelled %d queued build(s)", self.name, why, cancelled)

    def _report_listed_nothing(self) -> None:
        """Keep, and name in one warning, the ops whose first calls in this (outermost) pass listed nothing."""
        counts: dict[str, int] = {}
        for (op, _), listed in self._listed.items():
            if not listed:
                counts[op] = counts.get(op, 0) + 1
        self._listed = {}
        if not counts:
            return
        entries = [ListedNothing(op, self.name, n) for op, n in counts.items()]
        with core.listed_nothing_lock:
            core.listed_nothing.extend(entries)
        if len(entries) == 1:
            what, fixes = entries[0].describe(), listed_nothing_fixes(entries[0].op)
        else:
            ops = ", ".join(f"{e.op} ({e.signatures})" for e in entries)
            what = f"{len(entries)} ops listed nothing in pass {self.name!r} (call signatures): {ops}"
            fixes = listed_nothing_fixes("<op>")
        logger.warning("buildops: %s; %s", what, fixes)


def shape_key(dims: Mapping[str, int]) -> tuple:
    """A shape (``{spec key: value}``, one combination of an op's dim values) as a dict key."""
    return tuple(sorted(dims.items()))


def build_pass(name: str) -> BuildPass:
    """A build pass that waits for its builds at its end (when it is the outermost pass)."""
    return BuildPass(name, join_at_exit=True)


def rehearsal(name: str) -> BuildPass:
    """A build pass that does not wait at its end: builds go on until a later :func:`buildops.join`."""
    return BuildPass(name, join_at_exit=False)
