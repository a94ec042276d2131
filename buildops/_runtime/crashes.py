"""How a pool's workers crashed, and when a pool stops trying: a worker's end read from its exit status, and the
watch that refuses a pool's calls once its library has crashed natively in every worker that ran it (a broken
install would otherwise cost a pass two worker crashes per kernel)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

__all__ = ["CRASHES_WITH_NOTHING_BUILT", "NATIVE_CRASHES", "CrashWatch", "end_status", "how_it_ended"]

# The signals of a crash in the worker's own native code; a kill from outside (the OOM killer's SIGKILL) or an exit
# status says nothing of the library it ran.
NATIVE_CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
# Calls that crashed their workers twice natively, with none returned, before a pool refuses the rest: one crash can
# be one kernel's; this many different calls and no success is a library that crashes in every worker.
CRASHES_WITH_NOTHING_BUILT = 3

T = TypeVar("T")


def end_status(processes: Sequence[Any]) -> int | None:
    """A crashed pool's worker's exit status (negative: the signal that ended it), as the pool's own thread cached
    it when it reaped its workers, after :func:`.main_module.ended_importing_main` waited for that."""
    return next((status for p in processes if (status := getattr(getattr(p, "_popen", None), "returncode", None))),
                None)


def how_it_ended(code: int | None) -> str:
    """The tail of a crash's message: a signal (SIGSEGV, SIGABRT) points at native code in the build, an exit
    status at code that called ``os._exit``."""
    if code is None:
        return ""
    if code > 0:
        return f" (the worker exited with status {code})"
    try:
        return f" (the worker died of {signal.Signals(-code).name})"
    except ValueError:
        return f" (the worker died of signal {-code})"


class CrashWatch:
    """One pool's record of its calls: how many returned, how many run now, and which crashed their worker twice
    in native code while none had returned. :meth:`refuse` raises once :data:`CRASHES_WITH_NOTHING_BUILT` calls
    have, while none returned and none runs: a call still running may yet return (a worker's crash breaks the calls
    beside it too, which then retry), and one that returned makes every crash one kernel's."""

    def __init__(self, pool: str) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._returned = self._running = 0
        self._crashed: list[str] = []

    def refuse(self, what: str) -> None:
        """Raise RuntimeError, saying why, where the pool's workers crash whatever they run."""
        with self._lock:
            crashing = not (self._returned or self._running) and len(self._crashed) >= CRASHES_WITH_NOTHING_BUILT
            crashed = ", ".join(self._crashed[:CRASHES_WITH_NOTHING_BUILT])
        if crashing:
            raise RuntimeError(f"buildops: {what} not tried: {self._pool} workers crashed on {crashed} and built "
                               "nothing")

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around a call from its turn to its end, retry included."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def returned(self, result: T) -> T:
        with self._lock:
            self._returned += 1
        return result

    def crashed(self, what: str, code: int | None) -> None:
        """``what`` crashed its worker twice, which ended with status ``code``."""
        if code is not None and -code in NATIVE_CRASHES:
            with self._lock:
                if not self._returned:
                    self._crashed.append(what)
