"""Builds shared by the processes of one node: each build key is built by one process, the others wait for it.

The ranks of a tensor-parallel job usually need the same kernels, and they share the libraries' on-disk caches
(Triton's cache dir, FlashInfer's JIT dir, DeepGEMM's cache). Before it runs a shared build, a worker claims the
build's key with an exclusive file lock in ``BUILDOPS_NODE_LOCKS`` (default: a directory under the system's temp
dir, one per user). If another process holds the claim, the worker puts the build back at the end of its queue and
builds something else; when it comes back, the other process has finished and the build is a cache hit (a Triton
warmup that loads from disk, a ninja run with nothing to do). A process that dies releases its claims (the
operating system drops its locks), so no process waits for a dead one.

Security: only this user and root are trusted with the directory. It is made 0700, and one that another account
could change (owned by another user, writable by group or others, a symbolic link, under a directory another user
can rename it in) turns node sharing off with one warning. Lock files are 0600 and opened without following a
symbolic link and without truncating (docs/design.md, *Who can touch the lock directory*).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path

from .._config import settings
from .state import runtime

try:
    import fcntl
except ImportError:  # not POSIX: no node-wide claims
    fcntl = None

__all__ = ["LockFile", "NodeClaims", "lock_directory", "node_claims", "open_lock_file"]

logger = logging.getLogger("buildops")

# How often a claim that waits tries the lock again.
POLL_SECONDS = 0.01


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file ``path``, made 0600 if new, never through a symbolic link, never truncated.

    Why not filelock's ``FileLock``: up to 3.20.0 it followed a link planted at the lock's name and truncated its
    target (O_TRUNC); 3.20.1 added O_NOFOLLOW but still truncated on open, 3.30 truncates once it holds the lock,
    and all make the file 0644 unless told otherwise. What the project allows (>=3.12) spans all of them.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us
    fd = os.open(path, flags, 0o600)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
            raise PermissionError(f"lock file {path} is not a regular file of this user (uid {found.st_uid})")
        if found.st_mode & 0o077:  # made by an older buildops (0644): no one else may open it to lock it
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


class LockFile:
    """An exclusive ``flock`` on one lock file, held through its own descriptor (two in one process exclude each
    other too). Releasing unlocks before it closes: a child forked since holds a copy of the descriptor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, timeout: float | None = None) -> bool:
        """Take the lock, waiting at most ``timeout`` seconds (None: as long as it takes); False if not had."""
        assert fcntl is not None and self._fd is None
        fd = open_lock_file(self.path)
        try:
            if timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
                had = True
            else:
                had = _flock_within(fd, timeout)
        except BaseException:
            os.close(fd)
            raise
        if not had:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            assert fcntl is not None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def _flock_within(fd: int, timeout: float) -> bool:
    assert fcntl is not None
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_SECONDS, left))


class NodeClaims:
    """Exclusive, process-wide claims on build keys, as lock files in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: Hashable) -> Path:
        # repr, not hash(): the name must be the same in every process (hash() of a str is salted per process)
        return self.directory / (hashlib.sha256(repr(key).encode()).hexdigest()[:40] + ".lock")

    def try_claim(self, key: Hashable, wait: float) -> LockFile | _Unclaimed | None:
        """The claim on ``key`` if it can be had within ``wait`` seconds, else None; release it when done.

        Where the lock file cannot be made (the directory was removed, is another user's, is read-only), a claim
        that holds nothing, after a warning: the build goes ahead unshared rather than fail or be lost.
        """
        lock = LockFile(self.path(key))
        try:
            if not lock.acquire(timeout=wait):
                return None
        except OSError as error:
            _warn_unusable(self.directory, str(error))
            return _Unclaimed()
        return lock


class _Unclaimed:
    """A claim that holds nothing: the build is not shared with the node's other processes."""

    def release(self) -> None:
        pass


def _warn_unusable(directory: Path, why: str) -> None:
    if str(directory) not in runtime.warned_directories:  # once per directory, not once per build
        runtime.warned_directories.add(str(directory))
        logger.warning("buildops: BUILDOPS_NODE_LOCKS directory %s cannot be used (%s); builds go on without "
                       "node-wide claims, so other processes of this node may build the same kernels. Set "
                       "BUILDOPS_NODE_LOCKS=<a directory you own, mode 0700>, or off.", directory, why)


def lock_directory() -> Path | None:
    """The directory ``BUILDOPS_NODE_LOCKS`` names, or None when it is ``off``. Makes nothing and checks nothing:
    :func:`node_claims` does."""
    where = settings.node_locks
    return None if where == "off" else _named_directory(where)


def _named_directory(where: str) -> Path:
    """The lock directory for a ``BUILDOPS_NODE_LOCKS`` value other than off: the default ("") is one under the
    system's temp dir, one per user."""
    return Path(where) if where else Path(tempfile.gettempdir()) / f"buildops-node-locks-{os.getuid()}"


def node_claims() -> NodeClaims | None:
    """The claims directory from ``BUILDOPS_NODE_LOCKS``, or None when it is ``off`` or not safe to use."""
    where = settings.node_locks
    if where == "off" or fcntl is None:
        return None
    default = not where
    directory = _named_directory(where)
    try:
        why = _private_directory(directory, tighten=default)
    except OSError as error:
        why = str(error)
    if why is not None:
        _warn_unusable(directory, why)
        return None
    return NodeClaims(directory)


def _private_directory(directory: Path, *, tighten: bool) -> str | None:
    """Make ``directory`` (0700) if missing; why another local user could change it, or None if none can.

    ``tighten``: the directory is buildops' own (the default), so one left readable by an older buildops is made 0700.
    """
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    found = os.lstat(directory)
    me = os.geteuid()
    if stat.S_ISLNK(found.st_mode):
        return f"it is a symbolic link, owned by uid {found.st_uid}"
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a directory"
    if found.st_uid != me or found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"owned by uid {found.st_uid} with mode {stat.S_IMODE(found.st_mode):04o}; it must be this user's "
                f"(uid {me}) and writable by no one else, or another local user could replace its lock files")
    if tighten and found.st_mode & 0o077:
        os.chmod(directory, 0o700)
    # Whoever can write a directory above it can rename it away and put their own in its place, unless that
    # directory is sticky (/tmp). Members of a group that may write one are trusted like the owner.
    real = Path(os.path.realpath(directory.parent))
    for above in (real, *real.parents):
        seen = os.stat(above)
        if seen.st_uid not in (0, me) or (seen.st_mode & stat.S_IWOTH and not seen.st_mode & stat.S_ISVTX):
            return (f"{above}, above it, is owned by uid {seen.st_uid} with mode {stat.S_IMODE(seen.st_mode):04o}: "
                    f"another local user could replace the directory")
    return None
