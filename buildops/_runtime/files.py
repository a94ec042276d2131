"""Files written whole or not at all: a reader (another process, another node) never sees half of one."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_atomically"]


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
