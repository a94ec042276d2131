"""Files written whole or not at all: a reader (another process, another node) never sees half of one."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

__all__ = ["MAX_JSON_BYTES", "read_json", "write_atomically"]

# The most a report or manifest that buildops reads may hold (a manifest holds kernels' source: megabytes)
MAX_JSON_BYTES = 256 * 2**20


def write_atomically(path: Path, data: bytes | str, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a new file beside it (named ``.<name>.<random>.tmp``), flushed to disk and
    renamed over ``path`` once complete; the new file is removed if anything fails. Makes ``path``'s directory.

    ``mode``: the file's permissions exactly; None leaves them to the umask (0666 less it), as ``open()`` would.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name opened exclusively, not mkstemp: its 0600 would stay on the file, where the umask should rule.
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike[str], what: str) -> object:
    """The JSON document in the file at ``path``, a ``what`` (``"buildops report"``): ``ValueError`` naming the
    file and what is wrong where it is larger than :data:`MAX_JSON_BYTES`, not UTF-8, not JSON, or nested deeper
    than Python's recursion allows; ``OSError`` where it cannot be read."""
    size = os.stat(path).st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{path}: not a {what}: {size} bytes, more than the {MAX_JSON_BYTES} one may hold")
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a {what}: not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: not a {what}: its JSON is nested too deep") from None
    except ValueError as error:
        raise ValueError(f"{path}: not a {what}: not JSON ({error})") from None
