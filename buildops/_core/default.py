"""The process's builder: created on first use, forgotten at :func:`shutdown` and by a forked child."""

from __future__ import annotations

import time

from .._runtime.hooks import on_shutdown
from .builder import Builder
from .state import core
from .sweeps import wait_for_sweeps

__all__ = ["current_builder", "default_builder", "join", "shutdown"]


def current_builder() -> Builder | None:
    """The process's builder if one was created, else None (creates nothing)."""
    return core.builder


def default_builder() -> Builder:
    """The process's builder, created on first use."""
    builder = core.builder
    if builder is not None:
        return builder
    with core.builder_lock:
        if core.builder is None:
            core.builder = Builder()
        return core.builder


def join(timeout: float | None = None, gpu_only: bool = False, op: str | None = None) -> bool:
    """Wait for the process's builds: all, only GPU ones, or one op's (by name or prefix); first, for the sweeps
    still listing after a rehearsal, whose builds are among them.

    Returns False if ``timeout`` seconds passed first. Failed builds do not raise: their ops compile on first use.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    if not wait_for_sweeps(timeout):
        return False
    builder = core.builder
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    return True if builder is None else builder.join(timeout=left, gpu_only=gpu_only, op=op)


def shutdown(wait: bool = True, timeout: float | None = None) -> None:
    """Cancel queued builds, stop the workers and backends' pools, and forget the builder (the next build makes
    a new one)."""
    deadline = None if timeout is None else time.monotonic() + timeout  # one for the workers and the pools
    with core.builder_lock:
        builder, core.builder = core.builder, None
    if builder is not None:
        builder.shutdown(wait=wait, timeout=timeout)
        for op in list(builder.waiting_ops):
            op.forget_pending()
    on_shutdown.run(wait, deadline)
