"""Tasks for worker-pool tests, in a module of their own: spawned workers import it, and it imports nothing heavy."""

import os
import signal
import time


def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def crash(after: float) -> None:
    time.sleep(after)
    os._exit(3)  # as a segfault in a compiler would end the worker


def segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)  # as a native library's crash ends the worker


def crash_then_hang(marker: str) -> None:
    """Crash the first worker that runs it; hang in the next one (a build whose retry gets stuck)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    time.sleep(600)


def imported(prefix: str) -> list[str]:
    """The modules this worker has imported whose names start with ``prefix``."""
    import sys
    return sorted(name for name in sys.modules if name == prefix or name.startswith(prefix + "."))


def wait_for_file(path: str) -> None:
    """Hold a worker until ``path`` exists (a test's gate across processes)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def append_line(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()
