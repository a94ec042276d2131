"""A build's files as one blob for the store, and back, verified.

Layout: the magic ``b"buildops-artifact\\x01"``, the header's length (8 bytes, big-endian), the header (JSON:
``{"key": KEY, "files": [[PATH, SIZE, SHA256], ...]}``), then each file's bytes in that order. Nothing in it is
executed or unpickled. :func:`unpack` checks everything before it returns anything: the magic, the header, the key
it was stored under, every path (relative, plain names, no ``..``), each file's size and sha256, and that no byte is
missing or left over; a blob that fails is refused whole with :class:`BadArtifact`, so a corrupt or partial
artifact is rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import struct
from collections.abc import Iterator, Mapping
from typing import IO

from .interface import CHUNK_BYTES

__all__ = ["BadArtifact", "pack", "unpack"]

MAGIC = b"buildops-artifact\x01"
_LENGTH = struct.Struct(">Q")
MAX_HEADER = 16 << 20


class BadArtifact(ValueError):
    """A blob from the store that is not a whole, intact artifact of the key asked for."""


def pack(key: str, files: Mapping[str, bytes]) -> bytes:
    """One blob holding ``files`` (relative POSIX path -> content) under ``key``."""
    names = sorted(files)
    for name in names:
        _check_path(name)
    header = json.dumps({"key": key, "files": [[n, len(files[n]), hashlib.sha256(files[n]).hexdigest()]
                                               for n in names]}, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *(files[n] for n in names)])


def unpack(key: str, source: bytes | IO[bytes]) -> Mapping[str, bytes]:
    """The files of ``source`` (a blob, or a seekable file holding one), stored under ``key``; :class:`BadArtifact`
    if any check fails (module docstring). A file is read a chunk at a time to check it, and each file's bytes
    are read from it again only when asked for: a large artifact is never held whole in memory."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    total = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    start = len(MAGIC) + _LENGTH.size
    lead = stream.read(start)
    if len(lead) < start or lead[:len(MAGIC)] != MAGIC:
        raise BadArtifact("not a buildops artifact (bad magic or too short)")
    (length,) = _LENGTH.unpack_from(lead, len(MAGIC))
    if length > MAX_HEADER or start + length > total:
        raise BadArtifact(f"header of {length} bytes does not fit the blob's {total}")
    try:
        header = json.loads(stream.read(length))
        stored_key, listed = header["key"], header["files"]
        entries = [(str(n), int(s), str(h)) for n, s, h in listed]
    except (ValueError, KeyError, TypeError) as error:
        raise BadArtifact(f"header does not parse: {error}") from None
    if stored_key != key:
        raise BadArtifact(f"holds key {str(stored_key)[:16]}..., not {key[:16]}...")
    places: dict[str, tuple[int, int]] = {}
    at = start + length
    for name, size, digest in entries:
        try:
            _check_path(name)
        except ValueError as error:
            raise BadArtifact(str(error)) from None
        if size < 0 or at + size > total:
            raise BadArtifact(f"{name}: {size} bytes listed, {max(0, total - at)} left (truncated)")
        if _sha256(stream, size) != digest:
            raise BadArtifact(f"{name}: content does not match its sha256")
        if name in places:
            raise BadArtifact(f"{name}: listed twice")
        places[name] = (at, size)
        at += size
    if at != total:
        raise BadArtifact(f"{total - at} bytes after the last file")
    return _Files(stream, places)


class _Files(Mapping[str, bytes]):
    """An unpacked artifact's files, each read from the checked blob when asked for."""

    def __init__(self, stream: IO[bytes], places: dict[str, tuple[int, int]]) -> None:
        self._stream, self._places = stream, places

    def __getitem__(self, name: str) -> bytes:
        at, size = self._places[name]
        self._stream.seek(at)
        return self._stream.read(size)

    def __iter__(self) -> Iterator[str]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)


def _sha256(stream: IO[bytes], size: int) -> str:
    digest = hashlib.sha256()
    while size > 0:
        chunk = stream.read(min(size, CHUNK_BYTES))
        if not chunk:
            break
        digest.update(chunk)
        size -= len(chunk)
    return digest.hexdigest()


def _check_path(name: str) -> None:
    parts = name.split("/")
    if (not name or name.startswith("/") or posixpath.normpath(name) != name
            or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts)):
        raise ValueError(f"artifact path {name!r} is not a plain relative path")
