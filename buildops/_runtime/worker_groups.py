"""A build worker's own process group: made as the worker starts (below the engine's CPU priority, killed once the
process that started the pool is gone), and how that process kills a worker with everything the worker started.

Each worker leads a process group of its own, which the compilers it starts (and theirs) join: a worker is stopped
by killing its group, so that a compiler stuck in a given-up build dies with it rather than living on with parent 1,
holding the engine's stdout and stderr (:mod:`.pools`).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["alive", "kill_group", "kill_pgid", "own_group", "start_worker"]

# How often a worker checks that its parent is alive, where it cannot wait on a pidfd.
PARENT_POLL_SECONDS = 0.5


def start_worker(nice: int, initializer: Callable | None, parent: int, environ: dict[str, str]) -> None:
    """A worker's first step: take ``environ``, the environment of the process that started the pool as it was then
    (a worker forked from the forkserver has the forkserver's, which lacks what the engine set since the forkserver
    started, such as a compiler's cache directory); lead a process group of its own, killed once ``parent`` (the
    process that started the pool) is gone; lower its CPU priority by ``nice`` (the compilers it runs inherit it),
    then run the pool's initializer. Where the cores are all busy, the engine's own threads then run first
    (docs/decisions/0003-workers-below-engine-priority.md)."""
    os.environ.clear()
    os.environ.update(environ)
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted here: stopping the worker kills the worker alone
        pass
    else:
        threading.Thread(target=_end_with, args=(parent,), name="buildops-parent-watch", daemon=True).start()
    if nice:
        try:
            os.nice(nice)
        except OSError:  # not permitted here: the worker builds at the engine's priority
            pass
    if initializer is not None:
        initializer()


def _end_with(parent: int) -> None:
    """In a worker that leads its group: kill the group once ``parent`` is gone. A process killed outright
    (SIGKILL, an unhandled SIGTERM) runs no exit hook to stop its workers, and a supervisor's signal to its group
    does not reach theirs. Not the worker's own parent: a forkserver outlives the process while a worker lives
    (each worker holds the pipe whose end it waits for)."""
    try:
        handle = os.pidfd_open(parent)  # not reused: the parent is alive while it starts a worker
    except (AttributeError, OSError):  # not Linux 5.3+, or gone already
        handle = None
    if handle is not None:
        select.select([handle], [], [])  # readable once the parent has exited
    else:
        while _exists(parent):
            time.sleep(PARENT_POLL_SECONDS)
    os.killpg(0, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, not ours to signal
        return True
    return True


def own_group(process: Any) -> int | None:
    """The worker's pid where it leads its own process group (see :func:`start_worker`), else None."""
    pid = getattr(process, "pid", None)
    try:
        return pid if isinstance(pid, int) and os.getpgid(pid) == pid else None
    except OSError:  # gone
        return None


def kill_pgid(pgid: int) -> bool:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # none left in it, or not ours
        return False
    return True


def kill_group(process: Any) -> None:
    """Kill a worker with its process group: the compilers it started, and their children. A worker that has not
    made its group yet (it runs no task before it has) is killed alone."""
    group = own_group(process)
    if group is not None and kill_pgid(group):
        return
    try:
        process.kill()
    except Exception:  # noqa: BLE001 - already gone
        pass


def alive(process: Any) -> bool:
    try:
        return process.is_alive()
    except Exception:  # noqa: BLE001 - not a child of this process any more, or closed
        return False
