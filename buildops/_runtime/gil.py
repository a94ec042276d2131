"""The GIL's switch interval while buildops works in the background.

A thread that makes a call which releases the GIL (a CUDA launch, a torch op, a file read) must get the GIL back
afterwards, and beside a thread that runs Python that wait lasts up to the switch interval: 5 ms by default. During
a start buildops' threads run Python while the engine's threads make thousands of such calls
(docs/decisions/0004-gil-switch-interval.md).

So while anything holds it (the builder, while it has builds queued or running; the background preparation of
``start_build_workers``) the interval is at most ``BUILDOPS_SWITCH_INTERVAL_US``; the last holder to let go
restores the interval there was before, unless someone set another meanwhile. Holders count process-wide, so
nested and concurrent holds compose. A forked child starts with no holder and the interval restored.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from .._config import settings
from .forking import forget_in_child

__all__ = ["hold", "holding", "release"]

_lock = threading.Lock()
_holders = 0
_restore_to: float | None = None  # the interval before the first holder, if a holder changed it
_ours: float | None = None  # the interval as set here, as the interpreter stores it (whole microseconds)


def hold() -> None:
    """Add a holder; the first one shortens the interval (a bad setting raises before anything changes)."""
    global _holders, _restore_to, _ours
    with _lock:
        if _holders == 0:
            limit = settings.switch_interval_us / 1e6
            current = sys.getswitchinterval()
            if 0 < limit < current:
                sys.setswitchinterval(limit)
                _restore_to, _ours = current, sys.getswitchinterval()
        _holders += 1


def release() -> None:
    """Drop a holder; the last one restores the interval, unless it was changed by someone else meanwhile."""
    global _holders, _restore_to, _ours
    with _lock:
        if _holders == 0:
            raise RuntimeError("buildops: the switch interval released more often than held")
        _holders -= 1
        if _holders == 0 and _restore_to is not None:
            if sys.getswitchinterval() == _ours:
                sys.setswitchinterval(_restore_to)
            _restore_to = _ours = None


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Hold the short interval for the block."""
    hold()
    try:
        yield
    finally:
        release()


@forget_in_child
def _forget_holders_after_fork() -> None:
    # The child has none of the threads that held it; the lock may have been held by one of them.
    global _lock, _holders, _restore_to, _ours
    _lock = threading.Lock()
    if _restore_to is not None and sys.getswitchinterval() == _ours:
        sys.setswitchinterval(_restore_to)
    _holders, _restore_to, _ours = 0, None, None

