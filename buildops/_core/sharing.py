"""A builder's side of the build store (``BUILDOPS_STORE``): share builds across the nodes of a cluster.

Around each shared build that has an :class:`~.build.Artifact`, after the node claim (:mod:`.claims`, the fast
path: one process of a node asks the store for a key):

1. a key the local cache holds already (``known_locally``) skips the store;
2. an artifact in the store is fetched, verified (:mod:`buildops.store.packing`) and installed into the local
   cache; the run then finds it cached. A bad one is dropped, built here and stored again; one that lacked an entry
   (its first node had it from another build) is stored again with what the run compiled;
3. otherwise the key is claimed in the store with a lease, renewed while it builds, and looked up once more
   (another node may have stored it and let go just before); after the run the artifact is stored and the claim
   released. A key another node holds is put back (the builder builds something else) and asked for again; it is
   built here once that node's lease lapses (it died) or it has held the key past ``BUILDOPS_BUILD_TIMEOUT``.

The store failing never fails a build or slows a start past one request's ``BUILDOPS_STORE_TIMEOUT``: the first
failure is logged once and the store is left alone for the rest of the process.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._config import read_or_default, redact_url, settings
from ..store import BuildStore, StoreError, TooLarge, open_store
from ..store.packing import BadArtifact, pack, unpack
from .build import Build

__all__ = ["StoreCounts", "StoreSharing", "store_sharing"]

logger = logging.getLogger("buildops")

# How long a worker waits before it puts back a build another node holds (as for node claims).
HELD_ELSEWHERE_WAIT_SECONDS = 0.05

# A fetched artifact up to this size is read into memory; a larger one into a temporary file.
SPOOL_IN_MEMORY_BYTES = 8 << 20


@dataclass
class StoreCounts:
    """What a process's builds took from and gave to the store."""

    store: str = ""             # its URL, password hidden
    fetched: int = 0            # artifacts fetched and installed
    fetched_bytes: int = 0
    fetch_seconds: float = 0.0  # spent getting and installing them
    stored: int = 0             # artifacts put in the store: built here, or fetched and completed here
    stored_bytes: int = 0
    known_locally: int = 0      # builds whose artifact the local cache held: the store was not asked
    waited_for_others: int = 0  # builds put back at least once because another node held them
    built_after_others: int = 0  # builds done here after another node held them past BUILDOPS_BUILD_TIMEOUT
    bad: int = 0                # artifacts from the store that failed verification (built here instead)
    failed: str | None = None   # the failure that turned the store off for this process


class _Shared(Protocol):
    build: Build
    timeout: float
    lease: Any
    held_elsewhere_since: float | None
    outwaited: bool
    origin: str | None


class StoreSharing:
    """The build store as one builder uses it; thread-safe. See the module docstring."""

    def __init__(self, url: str, timeout: float, lease: float, max_bytes: int | None = None) -> None:
        self.url, self.timeout, self.lease = url, timeout, lease
        self.max_bytes = max_bytes  # BUILDOPS_STORE_MAX_MB: larger artifacts are built here and kept local
        self._store: BuildStore | None = None
        self._opening = threading.Lock()
        self._lock = threading.Lock()
        self._counts = StoreCounts(store=redact_url(url))
        self._held: dict[int, Any] = {}  # leases held now, by id(record)
        self._renewing = threading.Condition(self._lock)
        self._renewer: threading.Thread | None = None

    @property
    def store(self) -> BuildStore:
        """The store, opened at its first use, on a builder's thread: opening may import a client library
        (``redis`` takes a second), which a pass's own thread should not wait for. Raises :class:`StoreError`."""
        if self._store is None:
            with self._opening:
                if self._store is None:
                    try:
                        self._store = open_store(self.url, self.timeout)
                    except ValueError as error:
                        raise StoreError(str(error)) from None
        return self._store

    @property
    def off(self) -> bool:
        return self._counts.failed is not None

    def counts(self) -> StoreCounts:
        with self._lock:
            return replace(self._counts)

    def before_run(self, record: _Shared) -> bool:
        """Fetch, or claim, ``record``'s artifact; False if another node builds it now (put it back)."""
        artifact = record.build.artifact
        if artifact is None or self.off or record.lease is not None:
            return True
        try:
            identity = artifact.identity()
            if artifact.known_locally():
                self._count(known_locally=1)
                return True
            found = self._fetch(record, identity)
            if found in ("fetched", "too large"):  # too large: built here, unclaimed (no node would fetch it)
                return True
            lease = self.store.claim(identity, self.lease)
            if lease is not None:
                self._hold(record, lease)
                # Check again: another node may have stored it and let go between the look above and the claim.
                if found == "missing" and self._fetch(record, identity) == "fetched":
                    self.release(record)
                return True
        except StoreError as error:
            self._turn_off(error)
            return True
        except Exception:
            logger.debug("buildops: sharing build %s through the store failed", record.build.describe(),
                         exc_info=True)
            return True
        return not self._still_waiting(record)

    def _fetch(self, record: _Shared, identity: str) -> str:
        """Fetch and install ``record``'s artifact: "fetched", "missing", "bad" (it failed verification) or "too
        large" (over ``BUILDOPS_STORE_MAX_MB``, left unread)."""
        artifact = record.build.artifact
        assert artifact is not None
        start = time.perf_counter()
        # Read into a spool, in memory while small and on disk beyond: an artifact is never held whole in memory.
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES, prefix="buildops-fetch-") as spool:
            try:
                size = self.store.read_into(identity, spool, self.max_bytes)
            except TooLarge as large:
                logger.warning("buildops: the build store's artifact of %s (op %s) is %.0f MiB, over "
                               "BUILDOPS_STORE_MAX_MB; building it here", record.build.describe(), record.build.op,
                               large.size / 2**20)
                return "too large"
            if size is None:
                return "missing"
            try:
                files = unpack(identity, spool)
                rejects = getattr(artifact, "rejects", None)  # the backend's own checks of what it would load
                problem = rejects(files) if rejects is not None else None
                if problem is not None:
                    raise BadArtifact(problem)
            except BadArtifact as bad:
                logger.warning("buildops: the build store's artifact of %s (op %s) is bad (%s); building it here",
                               record.build.describe(), record.build.op, bad)
                self._count(bad=1)
                return "bad"
            artifact.install(files)
        record.origin = "store"
        self._count(fetched=1, fetched_bytes=size, fetch_seconds=time.perf_counter() - start)
        return "fetched"

    def _still_waiting(self, record: _Shared) -> bool:
        """Whether to go on waiting for the node that holds ``record``'s key (it is put back meanwhile)."""
        now = time.monotonic()
        if record.held_elsewhere_since is None:
            record.held_elsewhere_since = now
            self._count(waited_for_others=1)
        if 0 < record.timeout < now - record.held_elsewhere_since:
            logger.warning("buildops: another node has held build %s of op %s in the build store for over %.0f s "
                           "(BUILDOPS_BUILD_TIMEOUT); building it here", record.build.describe(), record.build.op,
                           record.timeout)
            self._count(built_after_others=1)
            record.outwaited = True
            return False
        time.sleep(HELD_ELSEWHERE_WAIT_SECONDS)
        return True

    def after_build(self, record: _Shared) -> None:
        """Store what ``record``'s run built here (not fetched, nor found locally), or a fetched artifact with what
        its run had to compile beyond it, before its future is set."""
        artifact = record.build.artifact
        if artifact is None or self.off:
            return
        if record.origin == "store":
            collect = getattr(artifact, "collect_grown", None)
        elif record.lease is not None or record.outwaited:  # built here; both come after its identity was had
            collect = artifact.collect
        else:
            return
        if collect is None:
            return
        try:
            files = collect()
            if files:
                self._put(artifact.identity(), files)
        except StoreError as error:
            self._turn_off(error)
        except Exception:
            logger.debug("buildops: storing build %s failed", record.build.describe(), exc_info=True)

    def release(self, record: _Shared) -> None:
        """Release ``record``'s claim in the store, if it holds one, once its run ended (or never began)."""
        with self._lock:
            lease = self._held.pop(id(record), None)
        record.lease = None
        if lease is not None and not self.off:
            self._release(lease)

    def close(self) -> None:
        """Release the claims still held once the builder's workers are done (those of builds given up as stuck):
        other nodes build those keys now. The store stays open: a stuck build may yet return and use it."""
        with self._lock:
            leases = [] if self.off else list(self._held.values())
            self._held.clear()
            self._renewing.notify_all()
        for lease in leases:
            self._release(lease)

    def _put(self, identity: str, files: dict[str, bytes]) -> None:
        blob = pack(identity, files)
        if self.max_bytes is not None and len(blob) > self.max_bytes:
            logger.info("buildops: an artifact of %.0f MiB, over BUILDOPS_STORE_MAX_MB, is kept local",
                        len(blob) / 2**20)
            return
        self.store.put(identity, blob)
        self._count(stored=1, stored_bytes=len(blob))

    def _release(self, lease: Any) -> None:
        try:
            lease.release()
        except Exception:  # on a builder's thread, which must go on: it lapses by itself
            logger.debug("buildops: releasing a claim in the build store failed", exc_info=True)

    # -- leases ------------------------------------------------------------------------------------------------

    def _hold(self, record: _Shared, lease: Any) -> None:
        record.lease = lease
        with self._lock:
            self._held[id(record)] = lease
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew, name="buildops-store-leases", daemon=True)
                self._renewer.start()

    def _renew(self) -> None:
        """Renew the leases held, a third of a lease apart, while any is held."""
        while True:
            with self._lock:
                self._renewing.wait(self.lease / 3)
                held = list(self._held.items())
                if not held or self.off:
                    self._renewer = None
                    return
            for owner, lease in held:
                try:
                    renewed = lease.renew()
                except StoreError as error:
                    self._turn_off(error)
                    break
                except Exception:  # the renewer must go on for the other leases
                    logger.debug("buildops: renewing a claim in the build store failed", exc_info=True)
                    renewed = False
                if not renewed:  # lapsed: another node may hold the key now; this one just builds it too
                    with self._lock:
                        if self._held.get(owner) is lease:
                            del self._held[owner]

    def _count(self, **added: float) -> None:
        with self._lock:
            for name, value in added.items():
                setattr(self._counts, name, getattr(self._counts, name) + value)

    def _turn_off(self, error: StoreError) -> None:
        with self._lock:
            if self._counts.failed is not None:
                return
            self._counts.failed = str(error)
            self._held.clear()  # not released: each request to a failing store could cost a timeout; they lapse
            self._renewing.notify_all()
        logger.warning("buildops: %s; builds go on without the store for the rest of this process", error)


def store_sharing() -> StoreSharing | None:
    """The store ``BUILDOPS_STORE`` names, for a new builder (opened at its first use); None when unset."""
    url = read_or_default(type(settings).store)
    if not url:
        return None
    max_mb = read_or_default(type(settings).store_max_mb)
    return StoreSharing(url, read_or_default(type(settings).store_timeout),
                        read_or_default(type(settings).store_lease), max_mb * 2**20 if max_mb else None)
