"""The processes that builds start on this process's own threads (a compiler that Triton runs through
``subprocess``), so that those of a given-up build, and at exit those of every build still running, are killed
with their children.

A compiler that hangs would otherwise outlive its build, and this process: started with this process's file
descriptors, it holds its stdout and stderr open, and a supervisor reading them waits on. While a block of
:func:`building` runs on some thread, ``subprocess.Popen`` notes the processes that thread starts (a reference-counted
:class:`~.patching.Patch`); :func:`kill_started` kills those of one block, :func:`kill_all` (run at exit) those of
every block still running. The compilers stay in this process's group, so a terminal's Ctrl-C reaches them as it
reaches this process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .patching import Patch
from .state import runtime

__all__ = ["Started", "building", "kill_all", "kill_started"]


class Started:
    """The processes one :func:`building` block started, by pid, while it runs."""

    def __init__(self) -> None:
        self.pids: list[int] = []


def _noting_popen_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        started = getattr(runtime.children_here, "started", None)
        if started is not None and isinstance(self.pid, int):
            started.pids.append(self.pid)
    return __init__


_popen_patch = Patch(subprocess.Popen, "__init__", _noting_popen_init,
                     "Triton runs ptxas (and a host compiler) through subprocess with this process's file descriptors "
                     "and no way to stop it: buildops notes the processes a build's thread starts, to kill them "
                     "when the build is given up or the process exits")


@contextlib.contextmanager
def building() -> Iterator[Started]:
    """Note the processes this thread starts in the block (not those of other threads)."""
    _hook_exit()
    started, outer = Started(), getattr(runtime.children_here, "started", None)
    with runtime.children_lock:
        runtime.children_running.add(started)
    runtime.children_here.started = started
    _popen_patch.acquire()
    try:
        yield started
    finally:
        _popen_patch.release()
        runtime.children_here.started = outer
        with runtime.children_lock:
            runtime.children_running.discard(started)


def kill_started(started: Started) -> None:
    """Kill the processes a block started, and every process descended from them, at once."""
    _kill_trees(list(started.pids))


def kill_all() -> None:
    """Kill the processes of every block running now, with their descendants (at exit: see the module docstring)."""
    with runtime.children_lock:
        pids = [pid for started in runtime.children_running for pid in started.pids]
    _kill_trees(pids)


def _hook_exit() -> None:
    if runtime.children_exit_hooked:
        return
    with runtime.children_lock:
        if runtime.children_exit_hooked:
            return
        runtime.children_exit_hooked = True
    # Among threading's exit hooks, which run before the interpreter's atexit ones: a builder thread stuck in a
    # compile is a daemon, and its compiler must be gone before this process's stdout closes.
    register_at_exit = getattr(threading, "_register_atexit", None)
    try:
        if register_at_exit is not None:
            register_at_exit(kill_all)
            return
    except RuntimeError:  # threading's exit has begun: the interpreter's own hooks run after it
        pass
    import atexit
    atexit.register(kill_all)


def _children() -> dict[int, list[int]]:
    """This machine's processes by parent pid (Linux ``/proc``; empty elsewhere)."""
    by_parent: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return by_parent
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        by_parent.setdefault(int(fields[1]), []).append(int(name))
    return by_parent


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
    except OSError:  # gone (or reaped and reused by a process not ours: refused)
        return False
    return True


def _kill_trees(roots: list[int]) -> None:
    """Stop the roots and their descendants, generation by generation (a stopped process forks no more), then
    kill them all. A root already reaped is skipped: its pid may name another process now."""
    stopped = [pid for pid in roots if _alive(pid) and _signal(pid, signal.SIGSTOP)]
    frontier = list(stopped)
    while frontier:
        by_parent = _children()
        frontier = [child for pid in frontier for child in by_parent.get(pid, ())
                    if child not in stopped and _signal(child, signal.SIGSTOP)]
        stopped += frontier
    for pid in stopped:
        _signal(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a child of this process not yet reaped (a zombie has no children left to find)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != b"Z" and int(fields[1]) == os.getpid()
