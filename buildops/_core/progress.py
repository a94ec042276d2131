"""Progress of a long wait: a bar on a terminal, else a log line every few seconds."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["progress_bar"]

logger = logging.getLogger("buildops")

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
