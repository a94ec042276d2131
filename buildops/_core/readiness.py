"""When this process's start was ready to serve (``buildops.startup.rehearse_then_load`` marks it): what reports
split tunings by, and what tunings after it wait for gaps in serving for (:mod:`buildops._runtime.gaps`)."""

from __future__ import annotations

import time

from .state import core

__all__ = ["mark_ready", "ready_time"]


def mark_ready() -> None:
    core.ready_at = time.perf_counter()


def ready_time() -> float | None:
    """The ``time.perf_counter()`` at which the last start of this process was ready to serve, or None."""
    return core.ready_at
