"""The worker processes DeepGEMM's builds run in, and how many of them: as many as the builder has threads
(``BUILDOPS_THREADS``: by default the host's CPUs less a quarter, at most 4, kept for the engine), as long as free GPU
memory, less ``BUILDOPS_GPU_RESERVE_MB``, holds their CUDA contexts.

DeepGEMM compiles one kernel at a time per process, with one nvcc on one core, while its binding holds the GIL: one
compiling process per core is what keeps every core busy. Each process holds a CUDA context, whose size depends on
the GPU, the driver and torch, so it is measured, not assumed, where it could bind (free memory beyond the reserve
under :data:`CONTEXT_CEILING_BYTES` a worker): the first worker of a process opens its context alone, and the
driver's free memory before and after (less what this process's torch allocated meanwhile) is what one takes. The
pool then admits as many calls at once as free memory holds contexts, and starts workers as calls come. Dummy
operands are admitted apart, by the memory gate (:mod:`buildops._runtime.gpu`).

The workers stop once no DeepGEMM build has used them for :data:`IDLE_STOP_SECONDS`, so that their contexts do not
hold GPU memory into serving (an engine sizes its KV cache from what is free after its start); a later build
starts them again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..._config import settings
from ..._runtime.pools import WorkerPool
from .startup import FORKSERVER_PRELOAD
from .state import deep_gemm_state

__all__ = ["CONTEXT_CEILING_BYTES", "CONTEXT_FLOOR_BYTES", "FORKSERVER_PRELOAD", "IDLE_STOP_SECONDS", "Sizing",
           "in_use", "open_context", "pool", "sized"]

logger = logging.getLogger("buildops")
_MIB = 1 << 20

# Below any CUDA context measured with torch (300-600 MiB with CUDA's lazy module loading): a smaller measure means
# that memory was freed meanwhile, and is not taken at its word.
CONTEXT_FLOOR_BYTES = 256 * _MIB
# Above any CUDA context with torch (1-2 GiB where CUDA loads every module at once): where free memory beyond the
# reserve holds this much for every worker, a context's size cannot lower their number, and is not measured.
CONTEXT_CEILING_BYTES = 4 << 30

# How long the workers outlive the last build that used them: the builds a pass lists come in bursts, one after
# another, and a start's worth of workers (a spawn, torch's import, a context) is seconds.
IDLE_STOP_SECONDS = 2.0

pool = WorkerPool("DeepGEMM build", lambda: max(1, settings.threads), preload=FORKSERVER_PRELOAD)


@dataclass(frozen=True)
class Sizing:
    """How the pool was sized: ``workers`` calls at once; on a GPU, what one context took (None where free memory
    held every worker's whatever its size, unmeasured) and what was free (less the reserve) once the first worker
    had its own."""

    workers: int
    context_bytes: int | None = None
    room_bytes: int | None = None

    def describe(self) -> str:
        if self.room_bytes is None:
            return f"up to {self.workers} DeepGEMM worker processes"
        if self.context_bytes is None:
            return (f"up to {self.workers} DeepGEMM worker processes (BUILDOPS_THREADS={settings.threads}; "
                    f"{self.room_bytes / _MIB:.0f} MiB free beyond BUILDOPS_GPU_RESERVE_MB hold their contexts, "
                    f"whatever their size)")
        return (f"up to {self.workers} DeepGEMM worker processes (BUILDOPS_THREADS={settings.threads}; a CUDA "
                f"context takes {self.context_bytes / _MIB:.0f} MiB, {self.room_bytes / _MIB:.0f} MiB free beyond "
                f"the first and BUILDOPS_GPU_RESERVE_MB)")


def open_context(device: str) -> int:
    """In a worker: open this process's CUDA context on ``device`` (and keep it); returns the worker's pid."""
    import os

    torch.empty(1, device=device)
    torch.cuda.synchronize(device)
    return os.getpid()


def _memory(device: torch.device) -> tuple[int, int]:
    """(the driver's free memory, what this process's torch holds) on ``device``."""
    free, _total = torch.cuda.mem_get_info(device)
    return free, torch.cuda.memory_reserved(device)


def sized(device: torch.device | str) -> Sizing:
    """Size the pool, once each time it starts (see the module docstring): called before each call to it, it
    measures a context on the first, which waits for it, as do calls made meanwhile."""
    state = deep_gemm_state
    with state.sizing_lock:
        if state.sizing is None:
            state.sizing = _measure(torch.device(device))
            pool.limit(state.sizing.workers)
            logger.info("buildops: %s", state.sizing.describe())
        return state.sizing


def _measure(device: torch.device) -> Sizing:
    threads = max(1, settings.threads)
    if device.type != "cuda":
        return Sizing(threads)
    free_before, held_before = _memory(device)
    room = free_before - settings.gpu_reserve_mb * _MIB
    if room >= threads * CONTEXT_CEILING_BYTES:  # no context's size could bind: all start at once, unmeasured
        return Sizing(threads, None, room)
    try:
        pool.run("a CUDA context", open_context, str(device), build=False)
    except Exception as error:  # noqa: BLE001 - the builds then find out for themselves, one at a time
        logger.warning("buildops: DeepGEMM's first worker could not open a CUDA context on %s (%s: %s); its builds "
                       "run one at a time", device, type(error).__name__, error)
        return Sizing(1)
    free_after, held_after = _memory(device)
    measured = free_before - free_after - (held_after - held_before)
    context = max(CONTEXT_FLOOR_BYTES, measured)
    room = max(0, free_after - settings.gpu_reserve_mb * _MIB)
    return Sizing(max(1, min(threads, 1 + room // context)), context, room)


@contextlib.contextmanager
def in_use() -> Iterator[None]:
    """Around a build's calls to the pool: the workers stop :data:`IDLE_STOP_SECONDS` after the last such block
    ends, unless another begins meanwhile."""
    state = deep_gemm_state
    with state.sizing_lock:
        state.runs_in_pool += 1
        if state.idle_timer is not None:
            state.idle_timer.cancel()
            state.idle_timer = None
    try:
        yield
    finally:
        with state.sizing_lock:
            state.runs_in_pool -= 1
            if state.runs_in_pool == 0:
                timer = state.idle_timer = threading.Timer(IDLE_STOP_SECONDS, _stop_if_idle)
                timer.daemon = True
                timer.start()


def _stop_if_idle() -> None:
    state = deep_gemm_state
    with state.sizing_lock:  # a build that begins meanwhile waits, then starts the workers again
        if state.runs_in_pool == 0 and state.idle_timer is threading.current_thread():
            state.idle_timer = None
            state.sizing = None  # the next builds size it from the memory free then (the weights may fill it)
            pool.shutdown()
