"""Python's forkserver, which buildops' worker pools share with any other user of it in the process: what it imports
as it starts, and, in a forked child, forgetting the parent's."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Sequence
from typing import Any

from .forking import forget_in_child, free_in_child

__all__ = ["add_to_preload", "forget_the_forkserver"]

_lock = free_in_child(threading.Lock())  # pools and backends add to the list from several threads


def add_to_preload(preload: Sequence[str], first: Sequence[str] = ()) -> bool:
    """Add ``first`` before what the forkserver imports as it starts and ``preload`` after; False where the platform
    has no forkserver.

    What others asked it to import is kept, but the main module (``"__main__"``, the default): our workers never
    import it, and the children of other users still import it for themselves, as their preparation data says. Once
    the forkserver runs, a new list changes nothing; our workers then import the rest for themselves.

    Whatever adds to the list will fork workers from the forkserver: a child forked from this process forgets the
    parent's (:func:`forget_the_forkserver`)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver

    forget_in_child(forget_the_forkserver)
    with _lock:
        current = [m for m in getattr(forkserver._forkserver, "_preload_modules", []) if m != "__main__"]
        ours = [m for m in first if m not in current]
        later = [m for m in preload if m not in current and m not in ours]
        forkserver.set_forkserver_preload(ours + current + later)
    return True


def forget_the_forkserver() -> None:
    """In a forked child: Python's forkserver object still names the parent's server, and starting a pool through
    it would wait for a process that is not this one's child (``ChildProcessError`` on every build). Forgotten, it
    starts a server of this process's own. Closing the inherited end of the pipe that keeps the parent's server
    alive also lets that server exit with the parent."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # its private state, which typeshed leaves out
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"):
        if hasattr(server, name):
            setattr(server, name, None)
    if hasattr(server, "_lock"):
        server._lock = threading.Lock()
