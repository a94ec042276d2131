"""CUDA graph capture and GPU builds must not overlap.

A GPU build (a DeepGEMM run, a ``@builds_by_running`` op) launches kernels and allocates memory on its own stream.
During a capture in the default global mode, such work from another thread invalidates the capture; in a relaxed
mode it may be captured into the graph or take memory from the graph's pool. So before capturing, call
:func:`prepare_graph_capture` (it waits for every GPU build), and buildops guards the capture itself: once the
builder has seen a GPU build, ``torch.cuda.CUDAGraph.capture_begin`` raises :class:`GraphCaptureDuringBuild` while
GPU builds are queued or running.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from ._core.default import current_builder, join
from ._core.watchdog import stuck_gpu_builds
from ._runtime.patching import Patch

__all__ = ["GraphCaptureDuringBuild", "prepare_graph_capture"]


class GraphCaptureDuringBuild(RuntimeError):
    """A CUDA graph capture began while buildops' GPU builds were queued or running."""


def prepare_graph_capture(timeout: float | None = None) -> None:
    """Wait for every GPU build, so that a CUDA graph capture can begin.

    Args:
        timeout: seconds to wait at most (default: no limit).

    Raises:
        TimeoutError: GPU builds still run after ``timeout``.
        GraphCaptureDuringBuild: a GPU build given up as timed out (``BUILDOPS_BUILD_TIMEOUT``) still runs: no wait
            ends it, and a capture beside it could take in its work.
    """
    if not join(gpu_only=True, timeout=timeout):
        raise TimeoutError(f"buildops: GPU builds still running after {timeout} s; not safe to capture a graph yet")
    stuck = stuck_gpu_builds()
    if stuck:
        ops = ", ".join(sorted({build.op for build in stuck}))
        raise GraphCaptureDuringBuild(
            f"buildops: {len(stuck)} GPU build(s) given up as timed out still run (ops: {ops}); a CUDA graph "
            f"captured now could take in their work. Find why they hang (the log names them), or capture without "
            f"buildops (BUILDOPS=0)")


def _guarded(original: Any) -> Any:
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        builder = current_builder()
        pending = builder.gpu_pending() if builder is not None else []
        stuck = stuck_gpu_builds()  # of a builder shut down since, too (gpu_pending has them as well)
        if stuck:
            ops = ", ".join(sorted({build.op for build in stuck}))
            raise GraphCaptureDuringBuild(
                f"CUDA graph capture began while {len(stuck)} GPU build(s) of buildops given up as timed out "
                f"still run (ops: {ops}); no join waits for them. Find why they hang (the log names them)")
        if pending:
            ops = ", ".join(sorted({build.op for build in pending}))
            raise GraphCaptureDuringBuild(
                f"CUDA graph capture began while {len(pending)} GPU build(s) of buildops are queued or running "
                f"(ops: {ops}); call buildops.prepare_graph_capture() (or buildops.join(gpu_only=True)) first")
        return original(self, *args, **kwargs)

    functools.update_wrapper(capture_begin, original, assigned=(), updated=())  # sets only __wrapped__
    return capture_begin


_GUARD = Patch(torch.cuda.CUDAGraph, "capture_begin", _guarded,
               "torch 2.11-2.13 have no hook before a CUDA graph capture begins; a GPU build's work on "
               "another thread would invalidate it")
_lock = threading.Lock()


def install_guard() -> None:
    """Guard ``CUDAGraph.capture_begin`` from now on: the builder calls this when it first receives a GPU build."""
    with _lock:
        if not _GUARD.active:
            _GUARD.acquire()
