"""The build store: where the nodes of a cluster claim builds and keep their artifacts (``BUILDOPS_STORE``).

A layer beside ``_runtime``: it imports only ``_config`` and the standard library (the Redis client lazily), so
that the builder, the command line and tests can all use it. :func:`open_store` makes a store from a URL;
:mod:`.packing` turns a build's files into one verified blob and back.
"""

from __future__ import annotations

from .interface import BuildStore, Lease, StoreError, open_store

__all__ = ["BuildStore", "Lease", "StoreError", "open_store"]
