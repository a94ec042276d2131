"""The walkthrough backend (docs/backends/writing-a-backend.md): buildops for ``shelljit`` (tests/shelljit.py), whose
kernels compile by running a shell command and whose artifact is the file it writes. Everything buildops needs of
it is here and in :func:`register`: passes, the builder, the build store, manifests, reports and ``buildops doctor``
take it with no other change."""

import contextlib
import contextvars
import hashlib
import os
import threading

import shelljit

from buildops import Build, LateCompile, Outcome
from buildops.backends import Backend, caller, on_builder_thread, record_late_compile, recorded
from buildops.backends import register as register_backend

VERSION = "1"  # of this backend's builds: part of every artifact's identity


def register() -> None:
    """One registration: each part names ``module:attribute``, imported when first needed."""
    register_backend(Backend(
        "shelljit", "shelljit",
        recorder="shelljit_backend:recording",
        late_watchers=("shelljit_backend:watch_late_compiles",),
        recipes="shelljit_backend",
        cache="shelljit:cache_dir",
        describe="shelljit_backend:describe",
    ))


# -- a build: the job, its run, its artifact --------------------------------------------------------------------

def build(op: str, name: str, source: str) -> Build:
    return Build(op, ("shelljit", name, shelljit.digest(name, source)), ShellRun(name, source), label=name,
                 library="shelljit", artifact=ShellArtifact(name, source))


class ShellRun:
    """Compile into shelljit's own cache; say whether it was there already."""

    def __init__(self, name: str, source: str) -> None:
        self.name, self.source = name, source

    def __call__(self) -> Outcome:
        cached = shelljit.compiled_path(self.name, self.source).exists()
        return Outcome(shelljit.compile(self.name, self.source), cached=cached)


class ShellArtifact:
    """The compiled file, shared through the build store (the ``Artifact`` contract)."""

    def __init__(self, name: str, source: str) -> None:
        self.path = shelljit.compiled_path(name, source)
        self.digest = shelljit.digest(name, source)

    def identity(self) -> str:
        return hashlib.sha256(f"shelljit|{VERSION}|{self.digest}".encode()).hexdigest()

    def known_locally(self) -> bool:
        return self.path.exists()

    def install(self, files) -> None:
        data = files.get(self.path.name)
        if data is None or self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        made = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        made.write_bytes(data)
        os.replace(made, self.path)

    def collect(self):
        return {self.path.name: self.path.read_bytes()} if self.path.exists() else None


# -- listing by replay: launches recorded as builds --------------------------------------------------------------

_recording: contextvars.ContextVar[tuple[str, list] | None] = contextvars.ContextVar("shelljit_rec", default=None)
_install_lock = threading.Lock()


@contextlib.contextmanager
def recording(op: str):
    """The ``recorder`` part: launches in this context are recorded, not run."""
    _wrap_launch()
    builds: list[Build] = []
    token = _recording.set((op, builds))
    try:
        yield builds
    finally:
        _recording.reset(token)


def _wrap_launch() -> None:
    with _install_lock:
        if getattr(shelljit.launch, "recorded", False):
            return
        original = shelljit.launch

        def launch(name, source, x):
            recording = _recording.get()
            if recording is None:
                return original(name, source, x)
            op, builds = recording
            made = build(op, name, source)
            builds.append(made)
            recorded(made)  # a pass may start it now, before the replay's host code ends
            return x  # what the op's host code goes on with; the pass returns the op's placeholder anyway

        launch.recorded = True
        shelljit.launch = launch


# -- late compiles ----------------------------------------------------------------------------------------------

def watch_late_compiles() -> None:
    """A ``late_watchers`` part: a compile outside the builder's threads, after a pass, is late."""
    if _report_late not in shelljit.hooks:
        shelljit.hooks.append(_report_late)


def _report_late(name: str, digest: str) -> None:
    if not on_builder_thread():  # buildops records it only after a pass
        record_late_compile(LateCompile("shelljit", name, digest[:16], (), caller()), ("shelljit", digest))


# -- manifests and doctor --------------------------------------------------------------------------------------

def entry(made: Build):
    """A manifest entry for one of this backend's builds (the ``recipes`` part)."""
    run = made.run
    assert isinstance(run, ShellRun)
    return {"library": "shelljit", "op": made.op, "label": made.describe(), "name": run.name, "source": run.source}


def prebuild_build(item: dict):
    return build(str(item["op"]), str(item["name"]), str(item["source"]))


def describe() -> dict[str, str]:
    return {"compiler": "sh"}
