"""What GPU builds share: a worker stream per thread, and a gate that admits dummy operands only where they fit.

A build that runs real work (``@builds_by_running``, DeepGEMM) allocates dummy operands on the GPU, often while
the checkpoint loads into the same memory. :class:`MemoryGate` admits an allocation only if free memory, less
``BUILDOPS_GPU_RESERVE_MB``, covers it; otherwise it waits for running builds to free theirs (fewer builds run at
once), and when none is running and it still does not fit, the build fails with :class:`NotEnoughGpuMemory`
(it is left to compile on first use, and the report lists it). The gate is this process's: builds in worker
processes (DeepGEMM's) each see only their own (``docs/design.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ._config import settings

__all__ = ["MemoryGate", "NotEnoughGpuMemory", "gate", "worker_stream"]

T = TypeVar("T")
_MIB = 1 << 20

_streams = threading.local()


def worker_stream(device: torch.device) -> torch.cuda.Stream:
    """This worker thread's own CUDA stream on ``device``, so builds never queue behind the user's stream."""
    cache = getattr(_streams, "by_device", None)
    if cache is None:
        cache = _streams.by_device = {}
    stream = cache.get(device)
    if stream is None:
        stream = cache[device] = torch.cuda.Stream(device=device)
    return stream


class NotEnoughGpuMemory(RuntimeError):
    """A build's dummy operands do not fit in free GPU memory less the reserve, even with no other build running."""


def free_bytes(device: torch.device) -> int:
    """Memory a new allocation can use: what the driver has free plus what torch's cache holds unused."""
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class MemoryGate:
    """Admits dummy-operand allocations that fit; see the module docstring."""

    def __init__(self, free: Callable[[torch.device], int] = free_bytes) -> None:
        self._free = free
        self._cond = threading.Condition()
        self._holding = 0
        self.waits = 0  # how often a build waited for others to free memory (the report's "ran fewer at once")

    def allocate(self, device: torch.device, nbytes: int, make: Callable[[], T], what: str,
                 reserve_mb: int | None = None) -> T:
        """``make()`` the operands once ``nbytes`` fit, leaving ``reserve_mb`` (default: the setting) free; the
        caller must :meth:`release` when done with them."""
        if device.type != "cuda":
            with self._cond:
                self._holding += 1
            return make()
        reserve = (settings.gpu_reserve_mb if reserve_mb is None else reserve_mb) * _MIB
        with self._cond:
            while True:
                free = self._free(device)
                if nbytes + reserve <= free:
                    operands = make()  # under the lock: the next check sees this allocation
                    self._holding += 1
                    return operands
                if self._holding == 0:
                    raise NotEnoughGpuMemory(
                        f"{what}: dummy operands need {nbytes / _MIB:.0f} MiB, {free / _MIB:.0f} MiB is free and "
                        f"BUILDOPS_GPU_RESERVE_MB keeps {reserve / _MIB:.0f} MiB; it will compile on first use")
                self.waits += 1
                self._cond.wait(timeout=1.0)

    def release(self) -> None:
        with self._cond:
            self._holding -= 1
            self._cond.notify_all()


gate = MemoryGate()


def run_admitted(device: torch.device, nbytes: int, make: Callable[[], Any], run: Callable[[Any], None],
                 what: str, reserve_mb: int | None = None) -> None:
    """Allocate through the gate, run on this worker's stream (on a GPU), wait for the work, release."""
    operands = gate.allocate(device, nbytes, make, what, reserve_mb)
    try:
        if device.type != "cuda":
            run(operands)
            return
        stream = worker_stream(device)
        stream.wait_stream(torch.cuda.default_stream(device))
        with torch.cuda.device(device), torch.cuda.stream(stream):
            run(operands)
        stream.synchronize()
    finally:
        del operands
        gate.release()
