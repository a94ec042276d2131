"""The build store in a directory every node mounts (``file:///DIR``, e.g. on NFS).

``DIR/artifacts/<key>`` holds a packed artifact, written to a temporary name and renamed into place (a reader sees
all of it or none). ``DIR/claims/<key>`` is a claim: made with ``O_EXCL`` holding the claimer's token; its
modification time, set to the lease's end at each renewal, says when it lapses. A claim is made whole under a
temporary name and hard-linked into place (the link fails if the claim exists). A node takes over a lapsed claim by
replacing it in one rename, once it has made a mark that only one claimer of that lapsed claim can make. Lease ends
are compared with this node's clock: the nodes' clocks must agree to well within a lease (NTP does).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

from .._runtime.files import write_atomically
from .interface import CHUNK_BYTES, BuildStore, Lease, StoreError, TooLarge, bounded, check_key

T = TypeVar("T")

__all__ = ["FileStore"]


class FileStore(BuildStore):
    """A store in the directory ``url`` names, which must exist unless ``create`` (``buildops store init``): a typo
    in ``BUILDOPS_STORE``, or a share not mounted, must not become an empty store of its own on one node."""

    def __init__(self, url: str, timeout: float, create: bool = False) -> None:
        self.url = url
        self.root = Path(url.removeprefix("file://"))
        self._timeout = timeout
        self._artifacts, self._claims = self.root / "artifacts", self.root / "claims"
        self._call("open", self._open, create)

    def _open(self, create: bool) -> None:
        if not create and not self.root.is_dir():
            raise StoreError(f"build store {self.where}: the directory {self.root} does not exist; fix "
                             f"BUILDOPS_STORE, or make the store there once with `buildops store init`")
        self._artifacts.mkdir(parents=True, exist_ok=True)
        self._claims.mkdir(exist_ok=True)

    def _call(self, what: str, request: Callable[..., T], *args: object) -> T:
        """One request, bounded as a whole by the store's timeout (:func:`.interface.bounded`): a share that hangs
        (an NFS server gone) turns the store off rather than the start."""
        return bounded(self.where, what, self._timeout, lambda: request(*args), lambda: None, (OSError,),
                       (TimeoutError,))  # a soft mount's ETIMEDOUT

    def read_into(self, key: str, into: IO[bytes], limit: int | None = None) -> int | None:
        path = self._artifacts / check_key(key)

        def read() -> int | None:
            try:
                with path.open("rb") as source:
                    size = os.fstat(source.fileno()).st_size
                    if limit is not None and size > limit:
                        raise TooLarge(size)
                    shutil.copyfileobj(source, into, CHUNK_BYTES)
                    return size
            except FileNotFoundError:
                return None

        return self._call("get", read)

    def put(self, key: str, blob: bytes) -> None:
        path = self._artifacts / check_key(key)
        self._call("put", write_atomically, path, blob)  # its temporary name starts with a dot

    def claim(self, key: str, lease: float) -> Lease | None:
        check_key(key)
        return self._call("claim", self._claim, key, lease)

    def _claim(self, key: str, lease: float) -> Lease | None:
        path, token = self._claims / key, secrets.token_hex(16)
        made = self._claims / f".{key}.{token}"
        # Made whole aside (token and lease end), then linked into place: a claim is never seen half made.
        made.write_text(token)
        end = time.time() + lease
        os.utime(made, (end, end))
        mark = None
        try:
            try:
                os.link(made, path)
            except FileExistsError:
                taken, mark = self._take_over(key, path, made)
                if not taken:
                    return None
        finally:
            made.unlink(missing_ok=True)
        return _FileLease(self, path, token, lease, mark)

    def _take_over(self, key: str, path: Path, made: Path) -> tuple[bool, Path | None]:
        """Put ``made`` in place of the claim at ``path`` if that one has lapsed. Returns whether this claimer did,
        and the mark it then holds while it holds the claim (see below; None where it made none).

        The claim is replaced by one rename, so that ``path`` always holds a claim. Claimers that find the same
        lapsed claim (the same file) first link a mark named by its inode: only the one whose link succeeds may
        replace it, and it checks that ``path`` still is that file before it does. The winner keeps the mark until
        it releases the claim, so that a claimer whose look at ``path`` is stale (an NFS client's attribute cache)
        cannot take the lapsed claim over again. The mark is a link to the new claim: it lapses with it, and a mark
        left by a claimer that died is removed by a later claim."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:  # released meanwhile: try once more
            try:
                os.link(made, path)
                return True, None
            except FileExistsError:
                return False, None
        try:
            lapsed = os.fstat(fd)
            if lapsed.st_mtime >= time.time():
                return False, None
            mark = self._claims / f".{key}.taking.{lapsed.st_ino}"
        finally:
            os.close(fd)
        try:
            os.link(made, mark)
        except FileExistsError:
            if _lapsed(mark):
                mark.unlink(missing_ok=True)  # its claimer died, or let its claim lapse; the next claim may try
            return False, None
        try:
            here = os.stat(path, follow_symlinks=False)
            if (here.st_dev, here.st_ino) == (lapsed.st_dev, lapsed.st_ino) and here.st_mtime < time.time():
                os.replace(made, path)
                self._drop_lapsed_marks(key, mark)
                return True, mark
        except FileNotFoundError:
            pass
        mark.unlink(missing_ok=True)  # taken over, renewed or released meanwhile
        return False, None

    def _drop_lapsed_marks(self, key: str, kept: Path) -> None:
        """Remove the key's marks whose claims lapsed unreleased (their holders died or gave them up), so that they
        neither pile up nor hold up a later takeover. A live mark links to a live claim, and is kept."""
        for mark in self._claims.glob(f".{key}.taking.*"):
            if mark != kept and _lapsed(mark):
                mark.unlink(missing_ok=True)

    def entries(self) -> Iterator[tuple[str, int]]:
        yield from self._call("list", lambda: [(p.name, p.stat().st_size) for p in self._artifacts.iterdir()
                                               if not p.name.startswith(".")])

    def claims(self) -> int:
        return self._call("list", lambda: sum(1 for p in self._claims.iterdir()
                                              if not p.name.startswith(".") and not _lapsed(p)))

    def clear(self) -> int:
        return self._call("clear", self._clear)

    def _clear(self) -> int:
        removed = 0
        for folder in (self._artifacts, self._claims):
            for path in folder.iterdir():
                path.unlink(missing_ok=True)
                removed += not path.name.startswith(".")
        return removed


# A claim this close to lapsing is left to lapse rather than unlinked by its release (capped at a quarter lease).
_RELEASE_MARGIN_SECONDS = 1.0


def _lapsed(path: Path) -> bool:
    try:
        return path.stat().st_mtime < time.time()
    except FileNotFoundError:
        return False


class _FileLease(Lease):
    """A claim file holding this claimer's token. Renewing and releasing act on the file this claimer made (its
    inode), never on one another node put at the path since."""

    def __init__(self, store: FileStore, path: Path, token: str, lease: float, mark: Path | None = None) -> None:
        self._store, self._path, self._token, self._lease, self._mark = store, path, token.encode(), lease, mark

    def _open_mine(self) -> int | None:
        """A descriptor on the claim file if it is still this claimer's, else None."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        if os.read(fd, len(self._token) + 1) == self._token:
            return fd
        os.close(fd)
        return None

    def renew(self) -> bool:
        return self._store._call("renew", self._renew)

    def _renew(self) -> bool:
        try:
            fd = self._open_mine()
            if fd is None:
                return False
            try:
                if os.fstat(fd).st_mtime < time.time():
                    return False  # lapsed: another claimer may be replacing it now
                end = time.time() + self._lease
                os.utime(fd, (end, end))
            finally:
                os.close(fd)
            return True
        except FileNotFoundError:
            return False

    def release(self) -> None:
        self._store._call("release", self._release)

    def _release(self) -> None:
        try:
            fd = self._open_mine()
            if fd is None:
                return
            try:
                mine = os.fstat(fd)
                here = os.stat(self._path, follow_symlinks=False)
                # Not replaced since it was read, and not about to lapse: a claim that may be taken over while
                # this unlinks it is left to lapse instead, so that the unlink never removes the new claimer's.
                if (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino) and \
                        mine.st_mtime > time.time() + min(_RELEASE_MARGIN_SECONDS, self._lease / 4):
                    self._path.unlink()
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass
        finally:
            if self._mark is not None:
                self._mark.unlink(missing_ok=True)
