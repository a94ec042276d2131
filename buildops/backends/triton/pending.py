"""What a recorded launch hands back where Triton's ``run`` returns the compiled kernel.

Some libraries put a dispatcher of their own between an op and Triton: it calls a kernel's ``run`` once per key of
its own, keeps the ``CompiledKernel`` that ``run`` returns, and from then on launches that object directly
(``kernel[grid](*args)``). A replay must hand such a layer something that behaves, after the pass, exactly as what a
lazy run would have handed it. :class:`PendingKernel` is that object:

* **Launched inside a recording** (a later replay of the same op, through the library's cache), it records its
  build once more, since the replayed shape needs it, and launches nothing: ``kernel[grid](*args)``, and the
  low-level ``kernel.run(grid0, grid1, grid2, stream, kernel.function, kernel.packed_metadata, ...)``, whose
  ``function`` and ``packed_metadata`` are then None.
* **Used anywhere else** (indexed by a grid, ``.run``, ``.metadata``, any attribute), it resolves, once, to the
  real kernel and acts as it: it waits for its build where that is queued or running (expedited, as a serving
  call's wait is), then takes the kernel from Triton's in-memory cache, where the build left it. Where the build
  failed, was cancelled or never ran, Triton compiles the kernel right there, as on first use without buildops,
  and the compile counts as late.

A pending kernel launched in a replay reports to this context's recording (``triton_state.recording``,
:mod:`.state`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from ..._core.build import Build
from ..._core.builder_threads import on_builder_thread
from ..._core.default import current_builder
from . import worker
from .state import triton_state

__all__ = ["PendingKernel", "Recorder"]

logger = logging.getLogger("buildops")


class Recorder(Protocol):
    """What a pending kernel needs of a recording (``triton_state.recording``: this context's, where launches go
instead of compiling, or None): the list its builds go to."""

    builds: list[Build]


class _RecordedLaunch:
    """A launch of a pending kernel inside a recording: when called, its build is recorded; nothing runs. (Reading
    ``kernel.run`` alone, as code that loads a module ahead does, records nothing.)"""

    __slots__ = ("_build", "_recording")

    def __init__(self, build: Build, recording: Recorder) -> None:
        self._build, self._recording = build, recording

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._recording.builds.append(self._build)


# What a low-level launch passes to ``run`` besides the grid and arguments: inside a recording, read for a launch
# that does not happen.
_LAUNCH_ARGUMENTS = frozenset({"function", "packed_metadata"})


class PendingKernel:
    """The compiled kernel a recorded launch stands for, resolved on first use outside a recording.

    Args:
        build: the recorded launch's build (its key finds its future on the builder).
        jit: the ``JITFunction`` launched.
        args: the launch's arguments, tensors as stand-ins.
        kwargs: the launch's keyword arguments and options, as passed.
        device: the device index the launch was recorded on.
    """

    __slots__ = ("_build", "_jit", "_args", "_kwargs", "_device", "_kernel", "_lock")

    def __init__(self, build: Build, jit: Any, args: tuple, kwargs: dict, device: int) -> None:
        self._build, self._jit, self._args, self._kwargs, self._device = build, jit, args, kwargs, device
        self._kernel: Any = None
        self._lock = threading.Lock()

    def __getitem__(self, grid: Any) -> Any:
        recording = triton_state.recording.get()
        if recording is not None:
            return _RecordedLaunch(self._build, recording)
        return self.resolve()[grid]

    def __getattr__(self, name: str) -> Any:  # only for names not in __slots__: the compiled kernel's
        if name.startswith("__"):  # protocols probed by copy, pickle and friends are not the kernel's
            raise AttributeError(name)
        if name == "run" or name in _LAUNCH_ARGUMENTS:
            recording = triton_state.recording.get()
            if recording is not None:
                return _RecordedLaunch(self._build, recording) if name == "run" else None
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        state = "resolved" if self._kernel is not None else "pending"
        return f"<buildops PendingKernel {self._build.describe()} ({state})>"

    def resolve(self) -> Any:
        """The real compiled kernel: the build's, waited for if it is in flight; else compiled here."""
        kernel = self._kernel
        if kernel is not None:
            return kernel
        with self._lock:
            if self._kernel is None:
                self._wait_for_build()
                self._kernel = self._load()
            return self._kernel

    def _wait_for_build(self) -> None:
        """Wait for this kernel's build where one is in flight; never on a builder's own thread (a build that
        launches it compiles it as part of itself), and never failing: the load below compiles what is missing."""
        builder = current_builder()
        if builder is None or on_builder_thread():
            return
        future = builder.future(self._build.key)
        if future is None or future.done():
            return
        try:
            builder.wait_for([future], self._build.op)
        except Exception:
            logger.warning("buildops: waiting for the build of %s failed; it compiles now if it must",
                           self._build.describe(), exc_info=True)

    def _load(self) -> Any:
        """The kernel from Triton's in-memory cache, as the launch looks it up (a lookup where the build loaded it;
        a disk-cache hit or, where the build did not happen, a compile, as on first use)."""
        import torch

        from .driver import compile_only

        if compile_only():
            return worker.warmup(self._jit, self._args, self._kwargs)
        with torch.cuda.device(self._device):
            return worker.warmup(self._jit, self._args, self._kwargs)
