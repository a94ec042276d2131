"""A builder's side of node claims (:mod:`buildops._runtime.node`): claim a shared build's key before building it.

A key another process of the node holds is put back and built later, when it is a cache hit; one held past
``BUILDOPS_BUILD_TIMEOUT`` is built here anyway, as this process's watchdog would have given it up
(docs/decisions/0008-node-claims-by-file-lock.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from .._runtime.node import NodeClaims
from .build import Build

__all__ = ["claim", "release"]

logger = logging.getLogger("buildops")

# How long a worker waits for another process's claim before it puts the build back.
CLAIM_WAIT_SECONDS = 0.05


class _Claiming(Protocol):
    build: Build
    claim: Any
    timeout: float
    refused_since: float | None


def claim(claims: NodeClaims, record: _Claiming) -> bool:
    """Claim ``record``'s key (kept on ``record.claim``); False if another process holds it and it should be put
    back. A claim that fails for another reason builds the record here, unshared."""
    try:
        record.claim = claims.try_claim(record.build.key, wait=CLAIM_WAIT_SECONDS)
    except Exception:  # a claim is an optimisation: build it here, unshared
        logger.warning("buildops: claiming build %s of op %s across the node failed; building it here",
                       record.build.describe(), record.build.op, exc_info=True)
        return True
    return record.claim is not None or _held_too_long(record)


def _held_too_long(record: _Claiming) -> bool:
    now = time.monotonic()
    if record.refused_since is None:
        record.refused_since = now
    if record.timeout <= 0 or now - record.refused_since <= record.timeout:
        return False
    logger.warning("buildops: another process of this node has held build %s of op %s for over %.0f s "
                   "(BUILDOPS_BUILD_TIMEOUT); building it here", record.build.describe(), record.build.op,
                   record.timeout)
    return True


def release(claim: Any, build: Build) -> None:
    """Release a claim (None: nothing to release)."""
    if claim is None:
        return
    try:
        claim.release()
    except Exception:  # the lock file's descriptor closes with the process anyway
        logger.debug("buildops: releasing the claim on %s failed", build.describe(), exc_info=True)
