"""Every ``BUILDOPS_*`` setting, in one place.

Settings are read from the environment each time they are asked for (never at import, never into module
constants), so a process can set them any time before the first use. A bad value fails loudly with the
variable, the value and what was expected. :meth:`settings.scope` overrides settings for a block; tests use it
instead of touching ``os.environ``.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigError", "cpu_share", "default_workers", "settings", "triton_executor"]


class ConfigError(ValueError):
    """A ``BUILDOPS_*`` setting has a value buildops cannot use."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r}: expected 1 or 0 (also true/false, yes/no, on/off)")


def _parse_node_locks(name: str, raw: str) -> str:
    """``off``, or the directory ("" for the default one). Relative paths are refused: the node's processes must
    all name the same directory, whatever each one's working directory."""
    value = raw.strip()
    if value.lower() in ("0", "false", "no", "off"):
        return "off"
    if value.lower() in ("", "1", "true", "yes", "on"):
        return ""
    value = os.path.expanduser(value)
    if not os.path.isabs(value):
        raise ConfigError(f"{name}={raw!r}: expected an absolute directory, which every process of the node names "
                          f"alike, or off")
    return value


def _parse_count(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r}: expected a whole number >= 1")
    return value


def _parse_whole(unit: str) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        value = raw.strip()
        if not (value.isascii() and value.isdigit()):  # isdigit alone takes "²", which int() refuses
            raise ConfigError(f"{name}={raw!r}: expected a whole number of {unit} >= 0")
        return int(value)
    return parse


def _parse_niceness(name: str, raw: str) -> int:
    value = raw.strip()
    if not (value.isascii() and value.isdigit()) or int(value) > 19:
        raise ConfigError(f"{name}={raw!r}: expected a whole number from 0 (the engine's priority) to 19 (the lowest)")
    return int(value)


def _parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not value >= 0:  # also rejects nan
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds >= 0")
    return value


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
    fewer than 4), and at most 32.

    Why leave cores idle: builds overlap the engine's own start, whose process keeps several threads busy
    meanwhile (its main thread, its loader, buildops' module loads and autotuning). A worker per core left those
    on the run queues and made the tiny LLM's start slower on the 16-core H200 host (``docs/design.md``).
    """
    return max(1, min(32, cpus - min(4, cpus // 4)))


# Triton's front end holds the GIL, so on many cores threads mostly wait for each other; processes do not.
# Measured on a 16-core H200 host, 48 variants: 16 threads 4.6-5.9x serial, 16 warm processes 9.2-12.6x. On a few
# cores the cost of starting processes is not won back. Processes only once warm (threads meanwhile) measured
# slower still on the tiny LLM's startup: in-process compiles starved its rehearsal of the GIL while the workers
# started, then the workers' start competed for the cores.
AUTO_PROCESSES_FROM_CPUS = 8


def triton_executor() -> str:
    """Where Triton builds compile: ``threads`` or ``processes`` (``auto``: processes where cores are many)."""
    executor = settings.executor
    if executor == "auto":
        return "processes" if cpu_share() >= AUTO_PROCESSES_FROM_CPUS else "threads"
    return executor


def _parse_choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
        return value
    return parse


def _parse_target(name: str, raw: str) -> tuple[str, int]:
    backend, _, arch = raw.strip().partition(":")
    if backend not in ("cuda", "hip") or not (arch.isascii() and arch.isdigit()):
        raise ConfigError(f"{name}={raw!r}: expected BACKEND:ARCH, e.g. cuda:90 (Hopper) or cuda:80 (Ampere)")
    return backend, int(arch)


@dataclass(frozen=True)
class _Setting:
    env: str
    parse: Callable[[str, str], Any]
    default: Callable[[], Any]
    doc: str


_SETTINGS = {
    "enabled": _Setting(
        "BUILDOPS", _parse_bool, lambda: True,
        "0 makes every decorator transparent and every pass a plain block.",
    ),
    "threads": _Setting(
        "BUILDOPS_THREADS", _parse_count, lambda: default_workers(cpu_share()),
        "Builds at once: worker threads of the builder, and worker processes (default: this process's CPU share "
        "less a quarter, at most 4 kept for the engine's own threads; at most 32).",
    ),
    "executor": _Setting(
        "BUILDOPS_EXECUTOR", _parse_choice("auto", "threads", "processes"), lambda: "auto",
        "Where Triton builds compile: worker threads, warm worker processes, or auto (processes on many cores).",
    ),
    "gpu_reserve_mb": _Setting(
        "BUILDOPS_GPU_RESERVE_MB", _parse_whole("MiB"), lambda: 1024,
        "GPU memory (MiB) that builds' dummy operands always leave free.",
    ),
    "deep_gemm_m": _Setting(
        "BUILDOPS_DEEP_GEMM_M", _parse_choice("relaxed", "full", "off"), lambda: "relaxed",
        "Which M values DeepGEMM builds run: relaxed (representative), full (every M up to the max), off.",
    ),
    "node_locks": _Setting(
        "BUILDOPS_NODE_LOCKS", _parse_node_locks, lambda: "",
        "Absolute directory of the lock files by which the processes of a node share builds, or off (also 0, "
        "false, no).",
    ),
    "late_compile": _Setting(
        "BUILDOPS_LATE_COMPILE", _parse_choice("warn", "error", "ignore"), lambda: "warn",
        "What a kernel compiled on first use after a pass does: warn (log once), error (raise), ignore.",
    ),
    "autotune": _Setting(
        "BUILDOPS_AUTOTUNE", _parse_bool, lambda: True,
        "On a GPU, run the autotuning of @triton.autotune launches in the build (on zeros), not at first use.",
    ),
    "triton_target": _Setting(
        "BUILDOPS_TRITON_TARGET", _parse_target, lambda: ("cuda", 90),
        "The target Triton builds compile for on a machine without a GPU driver (BACKEND:ARCH).",
    ),
    "switch_interval_us": _Setting(
        "BUILDOPS_SWITCH_INTERVAL_US", _parse_whole("microseconds"), lambda: 200,
        "The GIL's switch interval (microseconds) at most, while builds run; 0 leaves it alone.",
    ),
    "worker_nice": _Setting(
        "BUILDOPS_WORKER_NICE", _parse_niceness, lambda: 10,
        "How much build worker processes lower their CPU priority (added to their niceness, 0-19), so that the "
        "engine's own threads run first where the cores are all busy; 0 leaves it.",
    ),
    "build_timeout": _Setting(
        "BUILDOPS_BUILD_TIMEOUT", _parse_seconds, lambda: 900.0,
        "Seconds a build may run before it is given up as failed, so that a hung compile never holds an op's "
        "calls or a join; its op compiles on first use. 0: no limit.",
    ),
    "progress_after": _Setting(
        "BUILDOPS_PROGRESS_AFTER", _parse_seconds, lambda: 1.0,
        "Seconds a join waits before it shows a progress bar.",
    ),
}


class _Settings:
    """Attribute access to the settings: ``settings.threads``. Overrides from :meth:`scope` win over the env."""

    def __init__(self) -> None:
        self._overrides: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        setting = _SETTINGS.get(name)
        if setting is None:
            raise AttributeError(f"buildops has no setting {name!r}; known: {', '.join(sorted(_SETTINGS))}")
        if name in self._overrides:
            return self._overrides[name]
        raw = os.environ.get(setting.env)
        if raw is None or raw.strip() == "":
            return setting.default()
        return setting.parse(setting.env, raw)

    def describe(self) -> dict[str, str]:
        """Each setting's variable and what it does, for docs and ``--help`` texts."""
        return {s.env: s.doc for s in _SETTINGS.values()}

    @contextlib.contextmanager
    def scope(self, **overrides: Any) -> Iterator[None]:
        """Override settings for the block, then restore them: ``with settings.scope(threads=2): ...``.

        Values are Python values (``threads=2``, ``enabled=False``), checked by the same parsers as the env. The
        overrides are process-wide, seen by every thread (buildops' own included), and the block restores only the
        settings it named: scopes on other settings, in other threads, are left as they are.
        """
        parsed = {}
        for name, value in overrides.items():
            setting = _SETTINGS.get(name)
            if setting is None:
                raise ConfigError(f"settings.scope({name}=...): unknown setting; known: {', '.join(sorted(_SETTINGS))}")
            parsed[name] = setting.parse(setting.env, _as_env(value))  # what the environment would give: "0" is False
        missing = object()
        with self._lock:
            saved = {name: self._overrides.get(name, missing) for name in overrides}
            self._overrides.update(parsed)
        try:
            yield
        finally:
            with self._lock:
                for name, value in saved.items():
                    if value is missing:
                        self._overrides.pop(name, None)
                    else:
                        self._overrides[name] = value


def _as_env(value: Any) -> str:
    """How a Python value given to ``scope`` reads as an environment value, for validation."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return ":".join(map(str, value))
    return str(value)


settings = _Settings()
