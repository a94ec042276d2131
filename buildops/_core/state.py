"""The core layer's process-wide state in one object (:data:`core`), with what a reset, a shutdown and a forked
child do to it: one method each.

Every module of ``_core`` that keeps something for the life of the process keeps it here: the builder, the
registries (backends, op families, op names), what passes noted (coverage, ops that listed nothing, late
compiles), the sweeps handed to background listers, the given-up runs that still run, and the caches replays keep.
The modules' functions read and change their fields, under the lock beside them. Holders are changed in place,
never replaced, so that a name bound to one (``watchdog.stuck``) stays valid after a reset or a fork.

Not here: values per thread or per context (the ``contextvars`` of passes, sweeps and early starts; the builder
threads' role), which are not the process's; and locks that only serialise one-time work, made free in a forked
child where they are made (``free_in_child``, the standard library's own pattern).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from .._runtime.forking import forget_in_child
from .._runtime.hooks import on_reset, on_shutdown

__all__ = ["CoreState", "Stuck", "core"]


class Stuck:
    """Given-up runs not yet returned, of every builder of this process (:mod:`.watchdog`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: set[Any] = set()

    def add(self, record: Any) -> None:
        with self._lock:
            self._records.add(record)

    def discard(self, record: Any) -> None:
        with self._lock:
            self._records.discard(record)

    def holds(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is stuck in a given-up run (no one waits for it)."""
        with self._lock:
            return any(r.thread is thread for r in self._records)

    def gpu_builds(self) -> list[Any]:
        with self._lock:
            return [r.build for r in self._records if r.build.uses_gpu]

    def forget(self) -> None:
        """In a forked child: the parent's stuck runs are not the child's."""
        self._lock, self._records = threading.Lock(), set()


class CoreState:
    """The fields, by the module that uses them; each group's lock guards that group."""

    def __init__(self) -> None:
        # default: the process's builder, made on first use and forgotten at shutdown
        self.builder: Any = None
        self.builder_lock = threading.Lock()
        # extensions: the registered backends by name, and the first-GPU-build hooks ("module:attribute")
        self.registry_lock = threading.Lock()
        self.backends: dict[str, Any] = {}
        self.gpu_hooks: list[str] = []
        self.gpu_hooks_run = False
        # families: the registered op families
        self.families_lock = threading.Lock()
        self.families: list[Any] = []
        # names: each claimed op name -> (module, qualname) of its function, and weak references to its ops
        self.names_lock = threading.Lock()
        self.names: dict[str, tuple[str, str]] = {}
        self.name_holders: dict[str, list[Callable[[], Any]]] = {}
        # coverage: the values each (op, dim) was swept at, and the calls beyond a sweep's max
        self.coverage_lock = threading.Lock()
        self.swept: dict[tuple[str, str], set[int]] = {}
        self.beyond_max: list[Any] = []
        # passes: the ops that listed nothing in the outermost passes ended so far
        self.listed_nothing_lock = threading.Lock()
        self.listed_nothing: list[Any] = []
        # late: whether an outermost pass has ended, the late compiles recorded, and the keys already warned of
        self.late_lock = threading.Lock()
        self.late_armed = False
        self.late_seen: set[Hashable] = set()
        self.late_records: list[Any] = []
        # sweeps: the sweeps handed to background listers and not listed yet
        self.handed_lock = threading.Lock()
        self.handed_sweeps: set[Any] = set()
        # watchdog: the given-up runs that still run
        self.stuck = Stuck()
        # readiness: when this process's last start was ready to serve (time.perf_counter())
        self.ready_at: float | None = None
        # listing: the (op, custom op) pairs already warned of; meta_refs: its stand-ins, found once, and where
        # they stand while replays run on meta tensors
        self.replay_lock = threading.Lock()
        self.replay_warned: set[tuple[str, str]] = set()
        self.stand_ins: list[Any] | None = None
        self.stand_ins_placed: list[Any] = []
        self.meta_replays = 0
        # custom_ops: whether a library registered each of torch's Python kernels ("aten/name/Key"), and the aten
        # overrides last read with the size of torch's record they were read at
        self.library_kernels: dict[str, bool] = {}
        self.aten_overrides: tuple[int, frozenset[str]] = (-1, frozenset())

    def reset(self) -> None:
        """At ``buildops.testing.reset()`` (the builder is shut down by then): forget what passes noted, so the next
        test sees a process that ran none; free the names of collected ops; drop the sweeps still to list."""
        with self.coverage_lock:
            self.swept.clear()
            self.beyond_max.clear()
        with self.listed_nothing_lock:
            self.listed_nothing.clear()
        with self.late_lock:
            self.late_armed = False
            self.late_seen.clear()
            self.late_records.clear()
        self._free_names_of_collected_ops()
        self._drop_handed_sweeps()

    def shutdown(self, wait: bool, deadline: float | None) -> None:
        """At ``buildops.shutdown()``, after the builder stopped: what the handed sweeps would queue goes to no
        builder that anyone waits for."""
        self._drop_handed_sweeps()

    def after_fork(self) -> None:
        """In a forked child (its only thread; the parent's locks may be held, so none is taken: each is made
        anew). The parent's builder, its threads, its stuck runs and its replays are not the child's; its ops forget
        the builds they waited for."""
        builder, self.builder = self.builder, None
        if builder is not None:
            for op in list(builder.waiting_ops):
                op.forget_pending()
        for name in ("builder_lock", "registry_lock", "families_lock", "names_lock", "coverage_lock",
                     "listed_nothing_lock", "late_lock", "handed_lock", "replay_lock"):
            setattr(self, name, threading.Lock())
        self.handed_sweeps = set()
        self.stuck.forget()
        # A replay running in the parent never ends here: its stand-ins come out now (meta_refs).
        for stand_in in self.stand_ins_placed:
            stand_in.take_out()
        self.stand_ins_placed, self.meta_replays = [], 0

    def _free_names_of_collected_ops(self) -> None:
        # Only at a reset, after a collection: never in a serving process at a time a collection happens to choose.
        # Only ops of functions made at run time (a "<locals>" qualname, as tests make) are looked for: a module's
        # ops live as long as the module, so with none of the others, no collection.
        import gc

        with self.names_lock:
            local = any("<locals>" in self.names.get(name, ("", ""))[1] for name in self.name_holders)
        if not local:
            return
        gc.collect()
        with self.names_lock:
            for name, refs in list(self.name_holders.items()):
                if all(ref() is None for ref in refs):
                    del self.name_holders[name]
                    self.names.pop(name, None)

    def _drop_handed_sweeps(self) -> None:
        with self.handed_lock:
            sweeps = list(self.handed_sweeps)
        for sweep in sweeps:
            sweep.drop()


core = CoreState()
forget_in_child(core.after_fork)
on_reset.add(core.reset)
on_shutdown.add(core.shutdown)
