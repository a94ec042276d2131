"""When this process's start was ready to serve (``buildops.startup.rehearse_then_load`` marks it): what reports
split tunings by, and what tunings after it wait for gaps in serving for (:mod:`buildops._runtime.gaps`)."""

from __future__ import annotations

import time

__all__ = ["mark_ready", "ready_time"]

_ready_at: float | None = None


def mark_ready() -> None:
    global _ready_at
    _ready_at = time.perf_counter()


def ready_time() -> float | None:
    """The ``time.perf_counter()`` at which the last start of this process was ready to serve, or None."""
    return _ready_at
