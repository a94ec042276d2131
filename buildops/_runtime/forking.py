"""One registry of what a forked child must forget.

A child forked from a process with threads has none of those threads, and any lock one of them held stays held
in the child for good. Every module that keeps threads, locks or worker processes registers here a callback that
drops them; the callbacks run in the child right after the fork, in the order they were registered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["forget_in_child", "free_in_child"]

F = TypeVar("F", bound=Callable[[], None])
L = TypeVar("L", bound=Any)

_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()
_hooked = False


def forget_in_child(callback: F) -> F:
    """Run ``callback()`` in every child forked from now on (idempotent; usable as a decorator).

    Contract: a callback runs in the child's only thread with the parent's locks possibly held, so it takes none
    of them: it replaces them. It must not raise; one that does is skipped and the others still run.
    """
    global _hooked
    with _lock:
        if callback not in _callbacks:
            _callbacks.append(callback)
        if not _hooked:
            os.register_at_fork(after_in_child=_run_in_child)
            _hooked = True
    return callback


def free_in_child(lock: L) -> L:
    """``lock`` (a ``threading.Lock`` or ``RLock``), made free again in every child forked from now on; returns it:
    ``_lock = free_in_child(threading.Lock())``. The object stays the same, so whatever holds it (a ``Condition``,
    an ``import`` of it) stays valid, which a new lock put in the module's name would not give."""
    # The standard library resets its own module locks this way (threading, logging, concurrent.futures).
    forget_in_child(lock._at_fork_reinit)
    return lock


def _run_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:  # noqa: BLE001 - logging may itself deadlock in a fresh child; the others still run
            pass
