"""The build store: where the nodes of a cluster claim builds and keep their artifacts (``BUILDOPS_STORE``).

A layer above ``_runtime`` and below ``_core``: it imports only ``_config``, ``_runtime`` and the standard library
(the Redis client lazily), so that the builder, the command line and tests can all use it. :func:`open_store`
makes a store from a URL; :mod:`.packing` turns a build's files into one verified blob and back.
"""

from __future__ import annotations

import urllib.parse

from .._config import redact_url
from .interface import BuildStore, Lease, StoreError, TooLarge

__all__ = ["BuildStore", "Lease", "StoreError", "TooLarge", "open_store"]


def open_store(url: str, timeout: float = 2.0, create: bool = False) -> BuildStore:
    """The store at ``url``: ``redis://[:PASSWORD@]HOST:PORT/DB`` (``rediss://`` for TLS) or ``file:///DIR``.
    Requests give up after ``timeout`` seconds. A ``file:///`` store's directory must exist unless ``create``.
    Raises ``ValueError`` for another URL and :class:`StoreError` when the store cannot be used (the Redis client
    missing, a directory that does not exist)."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("redis", "rediss"):
        from .redis_store import RedisStore

        return RedisStore(url, timeout)
    if scheme == "file":
        from .file_store import FileStore

        return FileStore(url, timeout, create)
    raise ValueError(f"build store URL {redact_url(url)!r}: expected redis://, rediss:// or file:///")
