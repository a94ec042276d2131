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
import json
import posixpath
import struct

__all__ = ["BadArtifact", "pack", "unpack"]

MAGIC = b"buildops-artifact\x01"
_LENGTH = struct.Struct(">Q")
MAX_HEADER = 16 << 20


class BadArtifact(ValueError):
    """A blob from the store that is not a whole, intact artifact of the key asked for."""


def pack(key: str, files: dict[str, bytes]) -> bytes:
    """One blob holding ``files`` (relative POSIX path -> content) under ``key``."""
    names = sorted(files)
    for name in names:
        _check_path(name)
    header = json.dumps({"key": key, "files": [[n, len(files[n]), hashlib.sha256(files[n]).hexdigest()]
                                               for n in names]}, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *(files[n] for n in names)])


def unpack(key: str, blob: bytes) -> dict[str, bytes]:
    """The files of ``blob``, stored under ``key``; :class:`BadArtifact` if any check fails (module docstring)."""
    view = memoryview(blob)
    start = len(MAGIC) + _LENGTH.size
    if len(blob) < start or bytes(view[:len(MAGIC)]) != MAGIC:
        raise BadArtifact("not a buildops artifact (bad magic or too short)")
    (length,) = _LENGTH.unpack_from(blob, len(MAGIC))
    if length > MAX_HEADER or start + length > len(blob):
        raise BadArtifact(f"header of {length} bytes does not fit the blob's {len(blob)}")
    try:
        header = json.loads(bytes(view[start:start + length]))
        stored_key, listed = header["key"], header["files"]
        entries = [(str(n), int(s), str(h)) for n, s, h in listed]
    except (ValueError, KeyError, TypeError) as error:
        raise BadArtifact(f"header does not parse: {error}") from None
    if stored_key != key:
        raise BadArtifact(f"holds key {str(stored_key)[:16]}..., not {key[:16]}...")
    files: dict[str, bytes] = {}
    at = start + length
    for name, size, digest in entries:
        try:
            _check_path(name)
        except ValueError as error:
            raise BadArtifact(str(error)) from None
        if size < 0 or at + size > len(blob):
            raise BadArtifact(f"{name}: {size} bytes listed, {max(0, len(blob) - at)} left (truncated)")
        data = bytes(view[at:at + size])
        if hashlib.sha256(data).hexdigest() != digest:
            raise BadArtifact(f"{name}: content does not match its sha256")
        if name in files:
            raise BadArtifact(f"{name}: listed twice")
        files[name] = data
        at += size
    if at != len(blob):
        raise BadArtifact(f"{len(blob) - at} bytes after the last file")
    return files


def _check_path(name: str) -> None:
    parts = name.split("/")
    if (not name or name.startswith("/") or posixpath.normpath(name) != name
            or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts)):
        raise ValueError(f"artifact path {name!r} is not a plain relative path")
