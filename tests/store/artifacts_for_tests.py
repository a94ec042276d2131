"""A stand-in library for the store's tests: a build "compiles" a file into a node's cache directory, counted in
``compiles``; its artifact (the ``Artifact`` contract) is that file."""

import hashlib
import threading
import time
from pathlib import Path

from buildops import Build, Outcome


class FileArtifact:
    def __init__(self, name: str, cache: Path) -> None:
        self.name, self.cache = name, cache

    def identity(self) -> str:
        return hashlib.sha256(f"test-library|{self.name}".encode()).hexdigest()

    def known_locally(self) -> bool:
        return (self.cache / self.name).exists()

    def install(self, files: dict[str, bytes]) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        for name in files:  # one file's bytes in memory at a time, as a fetch streams them
            (self.cache / name).write_bytes(files[name])

    def collect(self):
        path = self.cache / self.name
        return {self.name: path.read_bytes()} if path.exists() else None


class Node:
    """One simulated node's library cache: builds compile into it unless the file is there."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.compiles: list[str] = []
        self._lock = threading.Lock()

    def build(self, name: str, seconds: float = 0.0, gate: threading.Event | None = None) -> Build:
        def run():
            if gate is not None:
                gate.wait(30)
            path = self.cache / name
            cached = path.exists()
            if not cached:
                time.sleep(seconds)
                self.cache.mkdir(parents=True, exist_ok=True)
                path.write_bytes(f"compiled {name}".encode() * 100)
                with self._lock:
                    self.compiles.append(name)
            return Outcome(cached=cached)
        return Build("op", ("test", name), run, label=name, library="test",
                     artifact=FileArtifact(name, self.cache))
