"""Builds started as soon as a replay records their launch, before the replay's host code ends.

A replay can go on long after its first launch: the first Python meta kernels a process runs import sympy, and library
code after a launch may take long (docs/decisions/0023-a-build-starts-as-its-launch-is-recorded.md), which a one-kernel
start would otherwise wait for before its only build begins. A backend calls :func:`recorded` for each launch it
records; within a pass's listing that queues the build at once (:meth:`.passes.BuildPass.start_early`), and the
listing's own queueing later finds it queued. Elsewhere (``op.builds_for``, which hands builds to its caller; a listing
recorder) it does nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator

from .build import Build

__all__ = ["recorded", "starting_early"]

logger = logging.getLogger("buildops")

_start: contextvars.ContextVar[Callable[[Build], None] | None] = contextvars.ContextVar("buildops_start_early",
                                                                                        default=None)


def recorded(build: Build) -> None:
    """A launch was just recorded as ``build``: start building it now where a pass's listing is under way.
    Never raises: the listing queues the build as usual."""
    start = _start.get()
    if start is None:
        return
    try:
        start(build)
    except Exception:
        logger.debug("buildops: starting %s as it was recorded failed; its listing queues it", build.describe(),
                     exc_info=True)


@contextlib.contextmanager
def starting_early(start: Callable[[Build], None]) -> Iterator[None]:
    """Within the block, on this thread, each launch a backend records is handed to ``start``."""
    token = _start.set(start)
    try:
        yield
    finally:
        _start.reset(token)
