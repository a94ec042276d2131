"""What the compilers on this host are: part of a build's identity in the build store."""

from __future__ import annotations

import functools
import shlex
import subprocess

__all__ = ["tool_version"]

# A compiler that takes longer than this to say its version is taken as broken.
VERSION_TIMEOUT_SECONDS = 60.0


@functools.cache
def tool_version(command: str) -> str:
    """``command --version``'s output (``command`` split as a shell would), once per process and command. Raises
    ``OSError`` or ``subprocess.SubprocessError`` where the tool is missing, fails or hangs."""
    result = subprocess.run([*shlex.split(command), "--version"], capture_output=True, text=True, check=True,
                            timeout=VERSION_TIMEOUT_SECONDS)
    return result.stdout.strip()
