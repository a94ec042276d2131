"""Every ``BUILDOPS_*`` setting, each declared once as a typed descriptor on the settings class. A setting:

* is read from its variable each time ``settings.<name>`` is asked for (never at import, never into module
  constants), so a process may set it any time before the first use; unset or blank gives the default, computed then;
* has its declared type, to type checkers too (``settings.threads`` is an ``int``, ``settings.executor`` one of
  its choices);
* raises :class:`ConfigError` for a bad value where it is read, naming the variable, the value and what was
  expected (:meth:`settings.validate` reads settings for that alone; a build pass's start and
  ``start_build_workers()`` validate them all); code that must not fail over a setting (an op's call while
  serving) reads it with :func:`read_or_default`, which logs a bad value once and gives the default;
* is overridden for a block by :meth:`settings.scope` (process-wide, checked by the same parser), never assigned;
* documents itself: ``help(settings)``, :meth:`settings.describe` and :func:`markdown_table` come from it.

Importing this module reads nothing, starts nothing and needs no torch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

from .kinds import (
    Choice,
    ConfigError,
    Count,
    Flag,
    NodeLocks,
    Seconds,
    Setting,
    Span,
    StoreUrl,
    Target,
    Whole,
    redact_url,
)

__all__ = ["ConfigError", "Setting", "as_env", "builder_only_workers", "cpu_share", "declared", "default_workers",
           "forget_logged", "markdown_table", "origin", "read_or_default", "redact_url", "settings", "triton_executor"]

logger = logging.getLogger("buildops")

T = TypeVar("T")

Executor = Literal["auto", "threads", "processes"]
DeepGemmM = Literal["relaxed", "full", "off"]
LateCompile = Literal["warn", "error", "ignore"]
ServingTune = Literal["defer", "inline"]

_UNSET: Any = object()

# The default worker count: at most this many builds at once, and at most this many CPUs left to the engine's threads
MAX_DEFAULT_WORKERS = 32
MAX_CPUS_KEPT = 4
# BUILDOPS_EXECUTOR=auto compiles Triton in worker processes from this many CPUs on
# (docs/decisions/0001-worker-processes-for-triton.md)
AUTO_PROCESSES_FROM_CPUS = 8


def cpu_share() -> int:
    """The number of CPUs this process may use: its affinity mask, lowered by a cgroup v2 quota if one is set."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        count = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    return count


def default_workers(cpus: int) -> int:
    """How many builds run at once by default on ``cpus`` CPUs: all of them but a quarter, at most 4 (none on
    fewer than 4), and at most 32. The cores left idle run the engine's own start beside the builds
    (docs/decisions/0010-default-worker-count.md).
    """
    return max(1, min(MAX_DEFAULT_WORKERS, cpus - min(MAX_CPUS_KEPT, cpus // 4)))


def builder_only_workers(cpus: int) -> int:
    """How many builds run at once by default in a process that only builds (``buildops prebuild``): one per CPU,
    at most 32. No engine's start shares the host there, so no core is kept for one
    (docs/decisions/0010-default-worker-count.md)."""
    return max(1, min(MAX_DEFAULT_WORKERS, cpus))


def triton_executor() -> Literal["threads", "processes"]:
    """Where Triton builds compile: ``threads`` or ``processes`` (``auto``: processes where cores are many)."""
    executor = settings.executor
    if executor == "auto":
        return "processes" if cpu_share() >= AUTO_PROCESSES_FROM_CPUS else "threads"
    return executor


class _Settings:
    """The ``BUILDOPS_*`` settings: ``settings.threads`` reads ``BUILDOPS_THREADS`` now, and overrides from
    :meth:`scope` win over the environment. ``type(settings).threads`` is the declaration."""

    __slots__ = ("_lock", "_overrides")

    def scoped(self, name: str) -> tuple[bool, Any]:
        """Whether :meth:`scope` overrides setting ``name`` now, and with what value (what its parser returned)."""
        value = self._overrides.get(name, _UNSET)
        return (False, None) if value is _UNSET else (True, value)

    enabled = Flag("BUILDOPS", "0 makes every decorator transparent and every pass a plain block.", lambda: True)
    threads = Count("BUILDOPS_THREADS", "Builds at once: worker threads of the builder, and worker processes "
                     "(default: this process's CPU share less a quarter, at most 4 kept for the engine's own threads; "
                     "at most 32; `buildops prebuild`: every CPU, at most 32).", lambda: default_workers(cpu_share()),
                     default_doc="CPU share less a quarter (at most 4 kept), at most 32")
    executor = Choice[Executor]("BUILDOPS_EXECUTOR", "Where Triton builds compile: worker threads, warm worker "
                                 "processes, or auto (processes on many cores).", lambda: "auto",
                                 choices=("auto", "threads", "processes"))
    gpu_reserve_mb = Whole("BUILDOPS_GPU_RESERVE_MB", "GPU memory (MiB) that builds' dummy operands always leave "
                            "free.", lambda: 1024, expected="a whole number of MiB >= 0")
    deep_gemm_m = Choice[DeepGemmM]("BUILDOPS_DEEP_GEMM_M", "Which M values DeepGEMM builds run where its choice of "
                                     "kernel is not predicted: relaxed (representative), full (every M up to the "
                                     "max); off: no DeepGEMM builds. Predicted builds run one M per kernel of every "
                                     "M up to the max.", lambda: "relaxed", choices=("relaxed", "full", "off"))
    node_locks = NodeLocks("BUILDOPS_NODE_LOCKS", "Absolute directory of the lock files by which the processes of "
                            "a node share builds, or off (also 0, false, no).", lambda: "",
                            default_doc="`<tmp>/buildops-node-locks-<uid>`")
    late_compile = Choice[LateCompile]("BUILDOPS_LATE_COMPILE", "What a kernel compiled on first use after a pass "
                                        "does: warn (log once), error (raise), ignore.", lambda: "warn",
                                        choices=("warn", "error", "ignore"))
    autotune = Flag("BUILDOPS_AUTOTUNE", "On a GPU, run the autotuning of @triton.autotune launches in the build "
                     "(on zeros), not at first use.", lambda: True)
    serving_tune = Choice[ServingTune]("BUILDOPS_SERVING_TUNE", "What an autotuned launch after a pass does at "
                                        "a key no build tuned: defer (run at once with the config tuned for the "
                                        "nearest key, queue its own tuning), inline (tune on the calling thread, "
                                        "as Triton does).", lambda: "defer", choices=("defer", "inline"))
    triton_target = Target("BUILDOPS_TRITON_TARGET", "The target Triton builds compile for on a machine without a "
                            "GPU driver (BACKEND:ARCH).", lambda: ("cuda", 90))
    switch_interval_us = Whole("BUILDOPS_SWITCH_INTERVAL_US", "The GIL's switch interval (microseconds) at most, "
                                "while builds run; 0 leaves it alone.", lambda: 200,
                                expected="a whole number of microseconds >= 0")
    worker_nice = Whole("BUILDOPS_WORKER_NICE", "How much build worker processes lower their CPU priority (added "
                         "to their niceness, 0-19), so that the engine's own threads run first where the cores are "
                         "all busy; 0 leaves it.", lambda: 10, at_most=19,
                         expected="a whole number from 0 (the engine's priority) to 19 (the lowest)")
    build_timeout = Seconds("BUILDOPS_BUILD_TIMEOUT", "Seconds a build may run before it is given up as failed, so "
                             "that a hung compile never holds an op's calls or a join; its op compiles on first use. "
                             "0: no limit.", lambda: 900.0)
    store = StoreUrl("BUILDOPS_STORE", "The build store shared by the nodes of a cluster (Redis, or a directory "
                      "every node mounts): builds are claimed there and their artifacts kept there. Empty: builds "
                      "are shared by the processes of one node only.", lambda: "", default_doc="empty (off)")
    store_timeout = Span("BUILDOPS_STORE_TIMEOUT", "Seconds one request to the build store may take; a store "
                             "that fails or is slower is left alone for the rest of the process (builds go on "
                             "locally).", lambda: 2.0)
    store_lease = Span("BUILDOPS_STORE_LEASE", "Seconds a node's claim on a build in the store lasts unless "
                           "renewed (it is renewed while the build runs): how long others wait for a node that "
                           "died mid-build.", lambda: 30.0)
    store_max_mb = Whole("BUILDOPS_STORE_MAX_MB", "The largest artifact (MiB) a node fetches from the build store "
                          "or puts there: a larger one is built here and kept local (a fetch spools it to disk, "
                          "and this bounds that file). 0: no limit.", lambda: 256,
                          expected="a whole number of MiB >= 0 (0: no limit)")
    tune_gap_ms = Whole("BUILDOPS_TUNE_GAP_MS", "Milliseconds the GPU's default stream must have been idle before an "
                        "autotuning after the start was ready runs (tunings go in gaps of serving). 0: at once.",
                        lambda: 50, expected="a whole number of milliseconds >= 0")
    progress_after = Seconds("BUILDOPS_PROGRESS_AFTER", "Seconds a join waits before it shows a progress bar.",
                              lambda: 1.0)

    def __init__(self) -> None:
        self._overrides: dict[str, object] = {}
        self._lock = threading.Lock()

    if not TYPE_CHECKING:  # hidden from type checkers, so that they report a misspelt setting themselves
        def __getattr__(self, name: str) -> NoReturn:
            raise AttributeError(f"buildops has no setting {name!r}; known: {', '.join(sorted(declared()))}")

    def describe(self) -> dict[str, str]:
        """Each setting's variable and what it does, for docs and ``--help`` texts."""
        return {setting.env: setting.doc for setting in declared().values()}

    def validate(self, *names: str) -> None:
        """Read the named settings (every one without names), so that bad values raise here: one
        :class:`ConfigError` naming each bad variable, its value and what was expected."""
        errors = []
        for name in names or declared():
            try:
                _declaration(name, f"settings.validate({name!r})").__get__(self)
            except ConfigError as error:
                errors.append(str(error))
        if errors:
            raise ConfigError("; ".join(errors))

    @contextlib.contextmanager
    def scope(self, **overrides: object) -> Iterator[None]:
        """Override settings for the block, then restore them: ``with settings.scope(threads=2): ...``.

        Values are Python values (``threads=2``, ``enabled=False``), checked by the same parsers as the env. The
        overrides are process-wide, seen by every thread (buildops' own included), and the block restores only the
        settings it named: scopes on other settings, in other threads, are left as they are.
        """
        parsed = {  # what the environment would give: "0" is False
            name: _declaration(name, f"settings.scope({name}=...)").parse(as_env(value))
            for name, value in overrides.items()
        }
        with self._lock:
            saved = {name: self._overrides.get(name, _UNSET) for name in parsed}
            self._overrides.update(parsed)
        try:
            yield
        finally:
            with self._lock:
                for name, value in saved.items():
                    if value is _UNSET:
                        self._overrides.pop(name, None)
                    else:
                        self._overrides[name] = value


def declared() -> dict[str, Setting[Any]]:
    """The settings by attribute name, in the order they are declared."""
    return {name: value for name, value in vars(_Settings).items() if isinstance(value, Setting)}


def origin(name: str) -> Literal["scope", "env", "default"]:
    """Where ``settings.<name>`` comes from now: a :meth:`settings.scope <_Settings.scope>` override, its
    variable (set and not blank), or its default. Reads no value: a bad one is the reader's to report."""
    setting = _declaration(name, f"origin({name!r})")
    if settings.scoped(name)[0]:
        return "scope"
    raw = os.environ.get(setting.env)
    return "default" if raw is None or raw.strip() == "" else "env"


def _declaration(name: str, where: str) -> Setting[Any]:
    known = declared()
    if name not in known:
        raise ConfigError(f"{where}: unknown setting; known: {', '.join(sorted(known))}")
    return known[name]


def as_env(value: object) -> str:
    """How a Python value reads as an environment value: for scope's validation and the docs' defaults."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return ":".join(map(str, value))
    return str(value)


def markdown_table() -> str:
    """The settings as a markdown table, ``| variable | type | default | meaning |``, one row each in declaration
    order. The type column says what a value may be; a computed default is said in words."""
    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for setting in declared().values():
        default = setting.default_doc or f"`{as_env(setting.default())}`"
        cells = (f"`{setting.env}`", setting.expected, default, setting.doc)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


settings = _Settings()


# The bad values read_or_default has logged, as (variable, raw value). No lock: dict.setdefault is atomic, and a
# forked child keeps a dict usable.
_logged: dict[tuple[str, str], object] = {}


def forget_logged() -> None:
    """Log each bad value again at its next :func:`read_or_default` (``buildops.testing.reset`` calls this)."""
    _logged.clear()


def read_or_default(setting: Setting[T]) -> T:
    """The value of ``setting`` (a declaration: ``type(settings).late_compile``) now, or its default where the
    value is bad. For code that must not fail over a setting: an op's call while serving, a compile hook, a wait.

    Contract: never raises :class:`ConfigError`. A bad value gives the default, and is logged as a warning naming
    the variable, the value, what was expected and the default used, once per variable and value (a process that
    reads it in every call logs it once). Anywhere a bad value can still stop the caller (a pass's start, an
    engine's call at startup), read ``settings.<name>`` instead, so that it fails loudly.
    """
    try:
        return setting.__get__(settings)
    except ConfigError as error:
        default = setting.default()
        marker = object()
        if _logged.setdefault((setting.env, os.environ.get(setting.env, "")), marker) is marker:
            logger.warning("buildops: %s; using the default, %s", error, as_env(default) or "unset")
        return default
