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
from collections.abc import Iterator

from .._config import settings
from .state import runtime

__all__ = ["hold", "holding", "release"]


def hold() -> None:
    """Add a holder; the first one shortens the interval (a bad setting raises before anything changes)."""
    with runtime.gil_lock:
        if runtime.gil_holders == 0:
            limit = settings.switch_interval_us / 1e6
            current = sys.getswitchinterval()
            if 0 < limit < current:
                sys.setswitchinterval(limit)
                runtime.gil_restore_to, runtime.gil_ours = current, sys.getswitchinterval()
        runtime.gil_holders += 1


def release() -> None:
    """Drop a holder; the last one restores the interval, unless it was changed by someone else meanwhile."""
    with runtime.gil_lock:
        if runtime.gil_holders == 0:
            raise RuntimeError("buildops: the switch interval released more often than held")
        runtime.gil_holders -= 1
        if runtime.gil_holders == 0 and runtime.gil_restore_to is not None:
            if sys.getswitchinterval() == runtime.gil_ours:
                sys.setswitchinterval(runtime.gil_restore_to)
            runtime.gil_restore_to = runtime.gil_ours = None


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Hold the short interval for the block."""
    hold()
    try:
        yield
    finally:
        release()
