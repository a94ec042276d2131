"""Builds shared by the processes of one node: each build key is built by one process, the others wait for it.

The ranks of a tensor-parallel job usually need the same kernels, and they share the libraries' on-disk caches
(Triton's cache dir, FlashInfer's JIT dir, DeepGEMM's cache). Before it runs a shared build, a worker claims the
build's key with an exclusive file lock in ``BUILDOPS_NODE_LOCKS`` (default: a directory under the system's temp
dir, one per user). If another process holds the claim, the worker puts the build back at the end of its queue and
builds something else; when it comes back, the other process has finished and the build is a cache hit (a Triton
warmup that loads from disk, a ninja run with nothing to do). A process that dies releases its claims (the
operating system drops its locks), so no process waits for a dead one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Hashable
from pathlib import Path

from filelock import FileLock, Timeout

from .._config import settings

__all__ = ["NodeClaims", "node_claims"]

logger = logging.getLogger("buildops")


class NodeClaims:
    """Exclusive, process-wide claims on build keys, as lock files in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, key: Hashable) -> Path:
        # repr, not hash(): the name must be the same in every process (hash() of a str is salted per process)
        return self.directory / (hashlib.sha256(repr(key).encode()).hexdigest()[:40] + ".lock")

    def try_claim(self, key: Hashable, wait: float) -> FileLock | _Unclaimed | None:
        """The claim on ``key`` if it can be had within ``wait`` seconds, else None; release it when done.

        Where the lock file cannot be made (the directory was removed, is another user's, is read-only), a claim
        that holds nothing, after a warning: the build goes ahead unshared rather than fail or be lost.
        """
        lock = FileLock(self.path(key), thread_local=False)
        try:
            lock.acquire(timeout=wait)
        except Timeout:
            return None
        except OSError as error:
            _warn_unusable(self.directory, error)
            return _Unclaimed()
        return lock


class _Unclaimed:
    """A claim that holds nothing: the build is not shared with the node's other processes."""

    def release(self) -> None:
        pass


_warned: set[str] = set()


def _warn_unusable(directory: Path, error: OSError) -> None:
    if str(directory) not in _warned:  # once per directory, not once per build
        _warned.add(str(directory))
        logger.warning("buildops: BUILDOPS_NODE_LOCKS directory %s cannot be used (%s); builds go on without "
                       "node-wide claims, so other processes of this node may build the same kernels. Set "
                       "BUILDOPS_NODE_LOCKS to a directory this user can write, or to off.", directory, error)


def node_claims() -> NodeClaims | None:
    """The claims directory from ``BUILDOPS_NODE_LOCKS``, or None when it is ``off``."""
    where = settings.node_locks
    if where == "off":
        return None
    directory = Path(where) if where else Path(tempfile.gettempdir()) / f"buildops-node-locks-{os.getuid()}"
    try:
        return NodeClaims(directory)
    except OSError as error:
        _warn_unusable(directory, error)
        return None
