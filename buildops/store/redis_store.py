"""The build store on Redis (``redis://`` or ``rediss://``): one string per artifact, one per claim.

Keys: ``buildops:artifact:<key>`` holds the packed artifact (:mod:`.packing`); ``buildops:claim:<key>`` holds the
claiming node's random token, with the lease as its expiry (``SET NX PX``). Renewing and releasing compare the token
first in one Lua script, so a node whose lease lapsed never extends or deletes another node's claim.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import IO, Any

from .interface import CHUNK_BYTES, BuildStore, Lease, StoreError, TooLarge, bounded, check_key

__all__ = ["RedisStore"]

PREFIX = "buildops:"
ARTIFACT = PREFIX + "artifact:"
CLAIM = PREFIX + "claim:"

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class RedisStore(BuildStore):
    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._timeout = timeout
        try:
            import redis
        except ImportError:
            raise StoreError("BUILDOPS_STORE names a Redis store but the redis client is not installed: "
                             "pip install 'buildops[store]'") from None
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._timeouts: tuple[type[BaseException], ...] = (redis.TimeoutError, TimeoutError)
        # No retries: the client's default retries with backoff for seconds, and a store that fails once is left
        # alone for the process anyway (a start is never slowed past one timeout).
        self._client: Any = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                                 retry_on_timeout=False, retry=Retry(NoBackoff(), 0))
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)

    def _call(self, what: str, request: Any, *args: Any) -> Any:
        """One request, bounded as a whole by the store's timeout (:func:`.interface.bounded`); past it the client's
        connections are closed, which ends the request."""
        return bounded(self.where, what, self._timeout, lambda: request(*args),
                       self._client.connection_pool.disconnect, self._errors, self._timeouts)

    def read_into(self, key: str, into: IO[bytes], limit: int | None = None) -> int | None:
        name = ARTIFACT + check_key(key)

        def read() -> int | None:  # the size first, then the value a range at a time, all under one deadline
            size = self._client.strlen(name)
            if not size:
                return None
            if limit is not None and size > limit:
                raise TooLarge(size)
            for start in range(0, size, CHUNK_BYTES):
                into.write(self._client.getrange(name, start, min(size, start + CHUNK_BYTES) - 1))
            return size  # a value replaced meanwhile reads mixed, which its verification refuses

        return self._call("get", read)

    def put(self, key: str, blob: bytes) -> None:
        self._call("put", self._client.set, ARTIFACT + check_key(key), blob)

    def claim(self, key: str, lease: float) -> Lease | None:
        name, token = CLAIM + check_key(key), secrets.token_hex(16)
        had = self._call("claim", lambda: self._client.set(name, token, px=_ms(lease), nx=True))
        return _RedisLease(self, name, token, lease) if had else None

    def entries(self) -> Iterator[tuple[str, int]]:
        names = self._call("list", lambda: list(self._client.scan_iter(match=ARTIFACT + "*", count=1000)))
        if not names:
            return
        sizes = self._call("list", lambda: _sizes(self._client, names))
        for name, size in zip(names, sizes):
            if size:  # removed meanwhile
                yield name.decode()[len(ARTIFACT):], int(size)

    def claims(self) -> int:
        return len(self._call("list", lambda: list(self._client.scan_iter(match=CLAIM + "*", count=1000))))

    def clear(self) -> int:
        names = self._call("list", lambda: list(self._client.scan_iter(match=PREFIX + "*", count=1000)))
        removed = 0
        for start in range(0, len(names), 1000):
            removed += self._call("clear", self._client.unlink, *names[start:start + 1000])
        return removed

    def close(self) -> None:
        self._client.close()


def _sizes(client: Any, names: list[bytes]) -> list[int]:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    return pipe.execute()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class _RedisLease(Lease):
    def __init__(self, store: RedisStore, name: str, token: str, lease: float) -> None:
        self._store, self._name, self._token, self._lease = store, name, token, lease

    def renew(self) -> bool:
        return bool(self._store._call("renew", self._store._renew, [self._name], [self._token, _ms(self._lease)]))

    def release(self) -> None:
        self._store._call("release", self._store._release, [self._name], [self._token])
