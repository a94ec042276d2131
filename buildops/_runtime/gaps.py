"""Gaps in a GPU's serving work: where a build that times kernels on the GPU (an autotuning) runs once the engine
serves, so that it neither slows a request nor is timed against one.

A tuning after the start was ready is one the rehearsal's own shapes did not need (those are tuned before ready):
a serving call at its key runs meanwhile with the config tuned for the nearest key. It waits until the device's
default stream, where the engine's work is queued unless it makes streams of its own, has had nothing queued for
``BUILDOPS_TUNE_GAP_MS`` (asked every :data:`POLL_SECONDS`: a quick ``cudaStreamQuery``), then runs; a tuning is
short (a few runs of each config), so it ends within a gap or delays one request by about that much. One that
has waited :data:`WAIT_LIMIT_SECONDS` for a gap runs regardless, and one a caller waits for (an urgent build)
waits for none.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .._config import read_or_default, settings

__all__ = ["wait_for_gap"]

# How often the device's stream is asked whether work is queued on it.
POLL_SECONDS = 0.005
# A tuning that has waited this long for a gap (a server busy without a pause) runs anyway.
WAIT_LIMIT_SECONDS = 300.0


def wait_for_gap(device: torch.device, skip: Callable[[], bool] = lambda: False) -> float:
    """Wait for a gap in ``device``'s serving work (the module docstring); returns the seconds waited. Returns at
    once off a GPU, with the setting at 0, or once ``skip()`` says so (asked at each poll)."""
    quiet = read_or_default(type(settings).tune_gap_ms) / 1000
    if device.type != "cuda" or quiet <= 0:
        return 0.0
    start = time.monotonic()
    idle_since: float | None = None
    while not skip():
        now = time.monotonic()
        if _stream_idle(device):
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= quiet:
                break
        else:
            idle_since = None
        if now - start >= WAIT_LIMIT_SECONDS:
            break
        time.sleep(POLL_SECONDS)
    return time.monotonic() - start


def _stream_idle(device: torch.device) -> bool:
    """Whether every piece of work queued on ``device``'s default stream has finished."""
    return torch.cuda.default_stream(device).query()
