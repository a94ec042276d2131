"""A stand-in JIT library for the walkthrough backend (tests/shelljit_backend.py, docs/backends/writing-a-backend.md):
a kernel is a shell command, compiled by running it; its output file, kept in ``SHELLJIT_CACHE_DIR`` under the hash
of the kernel's name and source, is the compiled kernel. ``launch`` compiles on first use, as JIT libraries do."""

import hashlib
import os
import subprocess
import threading
from pathlib import Path

compiles: list[str] = []  # the kernels this process compiled, in order
hooks: list = []  # called with (name, digest) after each compile, on the compiling thread
_lock = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("SHELLJIT_CACHE_DIR") or Path.home() / ".shelljit")


def digest(name: str, source: str) -> str:
    return hashlib.sha256(f"{name}\0{source}".encode()).hexdigest()


def compiled_path(name: str, source: str) -> Path:
    return cache_dir() / f"{name}-{digest(name, source)[:16]}.out"


def compile(name: str, source: str) -> Path:
    """The kernel's compiled file, made now (the command run, its output kept atomically) if not cached."""
    path = compiled_path(name, source)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    made = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    with made.open("wb") as out:
        subprocess.run(["sh", "-c", source], stdout=out, check=True)
    os.replace(made, path)
    with _lock:
        compiles.append(name)
    for hook in list(hooks):
        hook(name, digest(name, source))
    return path


def launch(name: str, source: str, x):
    """Run the kernel on ``x``: here, add its compiled file's length (compiled on first use)."""
    return x + len(compile(name, source).read_bytes())
