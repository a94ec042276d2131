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
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypeVar, cast, overload

__all__ = ["ConfigError", "Setting", "as_env", "cpu_share", "declared", "default_workers", "forget_logged",
           "markdown_table", "origin", "read_or_default", "settings", "triton_executor"]

logger = logging.getLogger("buildops")

T = TypeVar("T")
S = TypeVar("S", bound=str)
N = TypeVar("N", int, float)

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


class ConfigError(ValueError):
    """A ``BUILDOPS_*`` setting has a value buildops cannot use."""


class Setting(Generic[T]):
    """One ``BUILDOPS_*`` variable, declared on the settings class. Read on ``settings`` it gives the value now, a
    ``T``; read on the class it gives this declaration: ``env``, ``doc``, ``expected``, ``default``."""

    expected = ""  # what a value may be, in errors and in the docs' table

    def __init__(self, env: str, doc: str, default: Callable[[], T], *, default_doc: str | None = None,
                 expected: str | None = None) -> None:
        self.env = env
        self.doc = doc
        self.default = default  # called when the variable is unset, never before
        self.default_doc = default_doc  # the default in words, for the docs, where it is computed
        self.expected = self.expected if expected is None else expected
        self.name = ""
        self.__doc__ = f"{env}: {doc}\nValues: {self.expected}."

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.env})>"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: _Settings, owner: type | None = None) -> T: ...

    def __get__(self, obj: _Settings | None, owner: type | None = None) -> T | Setting[T]:
        if obj is None:
            return self
        value = obj._overrides.get(self.name, _UNSET)
        if value is not _UNSET:
            return cast(T, value)  # scope() stored what parse() returned
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default()
        return self.parse(raw)

    # A data descriptor, so help() shows its doc; `value: NoReturn` makes type checkers refuse any assignment.
    def __set__(self, obj: _Settings, value: NoReturn) -> NoReturn:
        raise AttributeError(f"settings.{self.name} is read from {self.env}; override it with "
                             f"settings.scope({self.name}=...)")

    def parse(self, raw: str) -> T:
        """``raw`` as a value of this variable, or a :class:`ConfigError` naming it."""
        value = self._convert(raw.strip())
        if value is None:
            raise ConfigError(f"{self.env}={self.shown(raw)}: expected {self.expected}")
        return value

    def shown(self, raw: str) -> str:
        """``raw`` as errors and logs may show it."""
        return repr(raw)

    def _convert(self, value: str) -> T | None:
        """``value`` (stripped) as a ``T``, or None where it is not one."""
        raise NotImplementedError


def _switch(value: str) -> bool | None:
    value = value.lower()
    return True if value in ("1", "true", "yes", "on") else False if value in ("0", "false", "no", "off") else None


def _number(kind: Callable[[str], N], value: str) -> N | None:
    with contextlib.suppress(ValueError):
        return kind(value)
    return None


class _Flag(Setting[bool]):
    expected = "1 or 0 (also true/false, yes/no, on/off)"

    def _convert(self, value: str) -> bool | None:
        return _switch(value)


class _Count(Setting[int]):
    expected = "a whole number >= 1"

    def _convert(self, value: str) -> int | None:
        count = _number(int, value)
        return count if count is not None and count >= 1 else None


class _Whole(Setting[int]):
    def __init__(self, env: str, doc: str, default: Callable[[], int], *, expected: str,
                 at_most: int | None = None) -> None:
        super().__init__(env, doc, default, expected=expected)
        self.at_most = at_most

    def _convert(self, value: str) -> int | None:
        if not (value.isascii() and value.isdigit()):  # isdigit alone takes "²", which int() refuses
            return None
        number = int(value)
        return number if self.at_most is None or number <= self.at_most else None


class _Seconds(Setting[float]):
    expected = "a number of seconds >= 0"

    def _convert(self, value: str) -> float | None:
        seconds = _number(float, value)
        return seconds if seconds is not None and seconds >= 0 else None  # nan compares false: refused


class _Span(Setting[float]):
    """Seconds that must pass: more than 0 and finite (a lease of 0 excludes no one; one of inf never lapses)."""

    expected = "a number of seconds > 0, finite"

    def _convert(self, value: str) -> float | None:
        seconds = _number(float, value)
        return seconds if seconds is not None and 0 < seconds < math.inf else None


class _Choice(Setting[S]):
    def __init__(self, env: str, doc: str, default: Callable[[], S], *, choices: tuple[S, ...]) -> None:
        super().__init__(env, doc, default, expected=f"one of {', '.join(choices)}")
        self.choices = choices

    def _convert(self, value: str) -> S | None:
        return next((choice for choice in self.choices if choice == value.lower()), None)


class _Target(Setting[tuple[str, int]]):
    expected = "BACKEND:ARCH, e.g. cuda:90 (Hopper) or cuda:80 (Ampere)"

    def _convert(self, value: str) -> tuple[str, int] | None:
        backend, _, arch = value.partition(":")
        if backend not in ("cuda", "hip") or not (arch.isascii() and arch.isdigit()):
            return None
        return backend, int(arch)


class _NodeLocks(Setting[str]):
    # "off", or the directory ("" for the default one). Relative ones are refused: every process must name the same.
    expected = "an absolute directory, which every process of the node names alike, or off"

    def _convert(self, value: str) -> str | None:
        switch = _switch(value) if value else True
        if switch is not None:
            return "" if switch else "off"
        path = os.path.expanduser(value)
        return path if os.path.isabs(path) else None


class _StoreUrl(Setting[str]):
    expected = "redis://[:PASSWORD@]HOST:PORT/DB, rediss://... (TLS) or file:///ABSOLUTE/DIR, or empty"

    def _convert(self, value: str) -> str | None:
        if not value:
            return ""
        parsed = urllib.parse.urlsplit(value)
        if parsed.scheme in ("redis", "rediss"):  # parsed whole: a bad port or database fails here, not at a build
            try:
                parsed.port  # noqa: B018 - reading it raises for a port that is not a number in range
            except ValueError:
                return None
            database = parsed.path.removeprefix("/")
            return value if parsed.hostname and (not database or database.isdigit()) else None
        if parsed.scheme == "file":
            return value if not parsed.netloc and parsed.path.startswith("/") and parsed.path != "/" else None
        return None

    def shown(self, raw: str) -> str:
        return repr(redact_url(raw))


def redact_url(url: str) -> str:
    """``url`` with its password, in the user part (``redis://:PW@host``, ``redis://user:PW@host``) or a
    ``password=`` query parameter, replaced by ``***``."""
    scheme, separator, rest = url.partition("://")
    if separator and "@" in rest:
        # The last "@" ends the user part, as URL parsers read it; a password may hold "#", "/" or "?" unescaped.
        user_part, _, host_part = rest.rpartition("@")
        if ":" in user_part:
            rest = f"{user_part.partition(':')[0]}:***@{host_part}"
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", f"{scheme}{separator}{rest}")


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

    enabled = _Flag("BUILDOPS", "0 makes every decorator transparent and every pass a plain block.", lambda: True)
    threads = _Count("BUILDOPS_THREADS", "Builds at once: worker threads of the builder, and worker processes "
                     "(default: this process's CPU share less a quarter, at most 4 kept for the engine's own threads; "
                     "at most 32).", lambda: default_workers(cpu_share()),
                     default_doc="CPU share less a quarter (at most 4 kept), at most 32")
    executor = _Choice[Executor]("BUILDOPS_EXECUTOR", "Where Triton builds compile: worker threads, warm worker "
                                 "processes, or auto (processes on many cores).", lambda: "auto",
                                 choices=("auto", "threads", "processes"))
    gpu_reserve_mb = _Whole("BUILDOPS_GPU_RESERVE_MB", "GPU memory (MiB) that builds' dummy operands always leave "
                            "free.", lambda: 1024, expected="a whole number of MiB >= 0")
    deep_gemm_m = _Choice[DeepGemmM]("BUILDOPS_DEEP_GEMM_M", "Which M values DeepGEMM builds run: relaxed "
                                     "(representative), full (every M up to the max), off.", lambda: "relaxed",
                                     choices=("relaxed", "full", "off"))
    node_locks = _NodeLocks("BUILDOPS_NODE_LOCKS", "Absolute directory of the lock files by which the processes of "
                            "a node share builds, or off (also 0, false, no).", lambda: "",
                            default_doc="`<tmp>/buildops-node-locks-<uid>`")
    late_compile = _Choice[LateCompile]("BUILDOPS_LATE_COMPILE", "What a kernel compiled on first use after a pass "
                                        "does: warn (log once), error (raise), ignore.", lambda: "warn",
                                        choices=("warn", "error", "ignore"))
    autotune = _Flag("BUILDOPS_AUTOTUNE", "On a GPU, run the autotuning of @triton.autotune launches in the build "
                     "(on zeros), not at first use.", lambda: True)
    serving_tune = _Choice[ServingTune]("BUILDOPS_SERVING_TUNE", "What an autotuned launch after a pass does at "
                                        "a key no build tuned: defer (run at once with the config tuned for the "
                                        "nearest key, queue its own tuning), inline (tune on the calling thread, "
                                        "as Triton does).", lambda: "defer", choices=("defer", "inline"))
    triton_target = _Target("BUILDOPS_TRITON_TARGET", "The target Triton builds compile for on a machine without a "
                            "GPU driver (BACKEND:ARCH).", lambda: ("cuda", 90))
    switch_interval_us = _Whole("BUILDOPS_SWITCH_INTERVAL_US", "The GIL's switch interval (microseconds) at most, "
                                "while builds run; 0 leaves it alone.", lambda: 200,
                                expected="a whole number of microseconds >= 0")
    worker_nice = _Whole("BUILDOPS_WORKER_NICE", "How much build worker processes lower their CPU priority (added "
                         "to their niceness, 0-19), so that the engine's own threads run first where the cores are "
                         "all busy; 0 leaves it.", lambda: 10, at_most=19,
                         expected="a whole number from 0 (the engine's priority) to 19 (the lowest)")
    build_timeout = _Seconds("BUILDOPS_BUILD_TIMEOUT", "Seconds a build may run before it is given up as failed, so "
                             "that a hung compile never holds an op's calls or a join; its op compiles on first use. "
                             "0: no limit.", lambda: 900.0)
    store = _StoreUrl("BUILDOPS_STORE", "The build store shared by the nodes of a cluster (Redis, or a directory "
                      "every node mounts): builds are claimed there and their artifacts kept there. Empty: builds "
                      "are shared by the processes of one node only.", lambda: "", default_doc="empty (off)")
    store_timeout = _Span("BUILDOPS_STORE_TIMEOUT", "Seconds one request to the build store may take; a store "
                             "that fails or is slower is left alone for the rest of the process (builds go on "
                             "locally).", lambda: 2.0)
    store_lease = _Span("BUILDOPS_STORE_LEASE", "Seconds a node's claim on a build in the store lasts unless "
                           "renewed (it is renewed while the build runs): how long others wait for a node that "
                           "died mid-build.", lambda: 30.0)
    store_max_mb = _Whole("BUILDOPS_STORE_MAX_MB", "The largest artifact (MiB) a node fetches from the build store "
                          "or puts there: a larger one is built here and kept local (a fetch spools it to disk, "
                          "and this bounds that file). 0: no limit.", lambda: 256,
                          expected="a whole number of MiB >= 0 (0: no limit)")
    progress_after = _Seconds("BUILDOPS_PROGRESS_AFTER", "Seconds a join waits before it shows a progress bar.",
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
    if name in settings._overrides:
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
