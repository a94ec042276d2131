"""Waiting for builds: until their futures are done, with progress shown once the wait grows long (a bar on a
terminal, else a log line every few seconds)."""

from __future__ import annotations

import concurrent.futures
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from .._config import read_or_default, settings

__all__ = ["progress_bar", "wait_until_done"]

logger = logging.getLogger("buildops")

# How often a progress bar, once shown, is brought up to date.
REFRESH_SECONDS = 0.2
# The shortest sleep until the bar is due.
MIN_STEP_SECONDS = 0.01


def wait_until_done(selected: Callable[[], list[concurrent.futures.Future[Any]]], timeout: float | None,
                    what: str) -> bool:
    """Wait until every future ``selected()`` returns is done, asking it again at each wake-up (so futures added
    meanwhile are waited for too); show progress after ``BUILDOPS_PROGRESS_AFTER`` seconds. Returns False if
    ``timeout`` passed first."""
    start = time.monotonic()
    progress_after = read_or_default(type(settings).progress_after)  # an op's call waits here too: never raise
    bar = None
    seen: set[concurrent.futures.Future[Any]] = set()
    try:
        while True:
            futures = selected()
            pending = [f for f in futures if not f.done()]
            seen.update(futures)
            if bar is not None:
                bar.total = len(seen)
                bar.n = len(seen) - len(pending)
                bar.refresh()
            if not pending:
                return True
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed >= timeout:
                return False
            if bar is None and elapsed >= progress_after:
                bar = progress_bar(what, len(seen), len(seen) - len(pending))
            step = REFRESH_SECONDS if bar is not None else max(progress_after - elapsed, MIN_STEP_SECONDS)
            if timeout is not None:
                step = min(step, timeout - elapsed)
            concurrent.futures.wait(pending, timeout=step, return_when=concurrent.futures.FIRST_COMPLETED)
    finally:
        if bar is not None:
            bar.close()


# How often a wait without a terminal logs its progress.
LOG_EVERY_SECONDS = 5.0


class _LoggedProgress:
    """Progress as a log line every few seconds, where no terminal shows a bar (a server's log, CI)."""

    def __init__(self, what: str, total: int, done: int, every: float = LOG_EVERY_SECONDS) -> None:
        self.what, self.total, self.n, self.every = what, total, done, every
        self._next = time.monotonic() + every

    def refresh(self) -> None:
        if time.monotonic() >= self._next:
            self._next = time.monotonic() + self.every
            logger.info("buildops: waiting for %s: %d of %d done", self.what, self.n, self.total)

    def close(self) -> None:
        pass


def progress_bar(what: str, total: int, done: int) -> Any:
    """An object with ``total``, ``n``, ``refresh()`` and ``close()``, as tqdm's bars have."""
    if not sys.stderr.isatty():
        return _LoggedProgress(what, total, done)
    from tqdm.auto import tqdm  # only long waits pay for it

    return tqdm(total=total, initial=done, desc=f"buildops: waiting for {what}", unit="build", leave=False)
