"""What every build store offers (:class:`BuildStore`, :class:`Lease`), and what it raises (:class:`StoreError`)."""

from __future__ import annotations

import abc
import concurrent.futures
import io
import threading
from collections.abc import Callable, Iterator
from typing import IO, TypeVar

from .._config import redact_url

__all__ = ["BuildStore", "Lease", "StoreError", "TooLarge", "check_key"]

# Names the store's keys, values and claims share: artifacts are named by their identity (a sha256 in hex).
KEY_LENGTH = 64

# How much of a value a store reads or copies at a time: a value is never held whole in memory on its way in.
CHUNK_BYTES = 4 << 20

T = TypeVar("T")


class TooLarge(Exception):
    """A stored value larger than the reader's limit (``BUILDOPS_STORE_MAX_MB``): ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


class StoreError(RuntimeError):
    """A request to the store failed: down, too slow, full, refused. Its text never holds a password."""


class Lease(abc.ABC):
    """A claim on one key in the store, held until released or until its lease lapses unrenewed."""

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the lease by its length from now; False if it lapsed meanwhile and another node holds the key."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the claim up now (a no-op if it lapsed); never releases another node's claim on the key."""


class BuildStore(abc.ABC):
    """A place every node reaches, holding build artifacts and claims by key.

    Contract for a backend:
      * Keys are identities of builds (:data:`KEY_LENGTH` hex characters); a backend refuses anything else
        with ``ValueError``, so that a key can never name a path or a pattern.
      * Every method either returns within the store's timeout or raises :class:`StoreError`; none raises
        anything else for the store being down, slow, full or refusing, and none waits for another node.
      * ``read_into`` writes exactly the bytes a ``put`` of that key stored, or returns None; a value is stored
        whole or not at all. A value replaced while it is read may read mixed: the caller verifies what it read
        (:mod:`.packing`), a backend does not.
      * ``put`` of a key already present may keep either value: equal keys hold interchangeable artifacts.
      * ``claim`` is exclusive across every node: while one lease on a key is held and renewed, ``claim`` of it
        elsewhere returns None. A lease not renewed for its length lapses, and the key can be claimed again.
      * Nothing read from a store is ever unpickled or executed by buildops.
    """

    url: str  # as given, password included: show ``where`` instead

    @property
    def where(self) -> str:
        """The store's URL without its password, for logs and reports."""
        return redact_url(self.url)

    @abc.abstractmethod
    def read_into(self, key: str, into: IO[bytes], limit: int | None = None) -> int | None:
        """Write the value of ``key`` into ``into`` a chunk at a time (:data:`CHUNK_BYTES`) and return its size, or
        None where there is none; :class:`TooLarge`, having read none of it, where it holds more than ``limit``
        bytes. The whole read is one request, under one deadline."""

    def get(self, key: str, limit: int | None = None) -> bytes | None:
        """The value of ``key`` in memory, or None (:meth:`read_into` for a value that may be large)."""
        into = io.BytesIO()
        return None if self.read_into(key, into, limit) is None else into.getvalue()

    @abc.abstractmethod
    def put(self, key: str, blob: bytes) -> None: ...

    @abc.abstractmethod
    def claim(self, key: str, lease: float) -> Lease | None:
        """A lease of ``lease`` seconds on ``key``, or None if another node holds one."""

    @abc.abstractmethod
    def entries(self) -> Iterator[tuple[str, int]]:
        """Each artifact's key and size in bytes."""

    @abc.abstractmethod
    def claims(self) -> int:
        """How many claims are held now."""

    @abc.abstractmethod
    def clear(self) -> int:
        """Remove every artifact and claim of buildops from the store; how many were removed."""

    def stats(self) -> dict[str, int | str]:
        """What the store holds: ``{"store": where, "artifacts": n, "bytes": total, "claims": held}``."""
        count = size = 0
        for _, length in self.entries():
            count += 1
            size += length
        return {"store": self.where, "artifacts": count, "bytes": size, "claims": self.claims()}

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to let go of
        """Let go of connections and files (a store is usable until then)."""


def bounded(where: str, what: str, timeout: float, request: Callable[[], T], on_timeout: Callable[[], None],
            errors: tuple[type[BaseException], ...], timeouts: tuple[type[BaseException], ...] = ()) -> T:
    """``request()`` bounded as a whole by ``timeout``: a socket's timeout bounds each read only (a link passing a
    few bytes a second never trips it), and a directory on a hung NFS mount bounds nothing. The request runs on a
    thread of its own; past the deadline ``on_timeout`` is called (to close connections, which ends it) and the
    caller gets a :class:`StoreError`, as it does for any of ``errors`` the request raised. One of ``timeouts`` (a
    client's own timeout, which may fire first) is the deadline's error too."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    threading.Thread(target=_run, args=(done, request), name="buildops-store-request", daemon=True).start()
    late = StoreError(f"build store {where}: {what} took longer than BUILDOPS_STORE_TIMEOUT ({timeout:g} s)")
    try:
        return done.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        on_timeout()
        raise late from None
    except timeouts:
        raise late from None
    except errors as error:
        raise StoreError(f"build store {where}: {what} failed: {type(error).__name__}: {error}") from None


def _run(done: concurrent.futures.Future[T], request: Callable[[], T]) -> None:
    try:
        done.set_result(request())
    except BaseException as error:  # noqa: BLE001 - the caller's to raise, as if it had made the request itself
        done.set_exception(error)


def check_key(key: str) -> str:
    """``key`` if it is a store key, else ``ValueError`` (the backends' contract)."""
    if len(key) != KEY_LENGTH or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not a build store key (64 lowercase hex characters): {key[:80]!r}")
    return key
