"""What GPU builds share: a worker stream per thread, and a gate that admits dummy operands only where they fit.

A build that runs real work (``@builds_by_running``, DeepGEMM) allocates dummy operands on the GPU, often while
the checkpoint loads into the same memory. :class:`MemoryGate` admits an allocation only if free memory, less
``BUILDOPS_GPU_RESERVE_MB``, covers it; otherwise it waits for running builds to free theirs (fewer builds run at
once), and when none is running and it still does not fit, the build fails with :class:`NotEnoughGpuMemory`
(it is left to compile on first use, and the report lists it). Why: docs/decisions/0009-memory-gate.md.

Builds in other processes of the node count too (DeepGEMM's worker processes, another rank on the same GPU):
where ``BUILDOPS_NODE_LOCKS`` is on, each check and allocation holds a file lock per GPU, so two processes never
both admit what fits once, and every admitted build holds a shared lock on a second file, which tells a build
that does not fit whether anyone else, in any process, may still free memory (the operating system drops a dead
process's locks).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from .._config import settings
from .node import LockFile, node_claims, open_lock_file
from .state import runtime

try:
    import fcntl
except ImportError:  # not POSIX: the gate counts this process's builds only
    fcntl = None

__all__ = ["MemoryGate", "NotEnoughGpuMemory", "gate", "worker_stream"]

T = TypeVar("T")
_MIB = 1 << 20
logger = logging.getLogger("buildops")

# How often a build waiting for memory checks again where other processes' builds count (they notify no one),
# and where only this process's count (a release here wakes it sooner).
NODE_POLL_SECONDS = 0.25
LOCAL_POLL_SECONDS = 1.0


def worker_stream(device: torch.device) -> torch.cuda.Stream:
    """This worker thread's own CUDA stream on ``device``, so builds never queue behind the user's stream."""
    cache = getattr(runtime.worker_streams, "by_device", None)
    if cache is None:
        cache = runtime.worker_streams.by_device = {}
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


def device_uuid(device: torch.device) -> str:
    """The GPU's own name, the same in every process whatever ``CUDA_VISIBLE_DEVICES`` numbers it."""
    properties = torch.cuda.get_device_properties(device)
    uuid = getattr(properties, "uuid", None)
    if uuid is not None:
        return str(uuid)
    return f"pci-{properties.pci_domain_id}-{properties.pci_bus_id}-{properties.pci_device_id}"


class _NodeHolders:
    """The processes of this node that hold dummy operands on one GPU, seen through two lock files. Made only
    where ``fcntl`` exists (:meth:`MemoryGate._node`)."""

    def __init__(self, directory: Path, device_id: str) -> None:
        # Held around each check of free memory and the allocation it admits, by every process.
        self.admitting = LockFile(directory / f"gpu-{device_id}.admit.lock")
        # Each admitted build keeps a shared lock on this file until it releases its operands.
        self._holders = directory / f"gpu-{device_id}.holders.lock"

    def hold(self) -> int:
        assert fcntl is not None
        fd = open_lock_file(self._holders)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def let_go(fd: int) -> None:
        """Drop a shared lock from :meth:`hold`. Unlocked before it is closed: a child forked since holds a copy
        of the descriptor, and closing ours alone would leave the lock held for as long as the child lives."""
        assert fcntl is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def anyone(self) -> bool:
        """Whether any build, in any process (this one included), holds operands on the GPU now."""
        assert fcntl is not None
        fd = open_lock_file(self._holders)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # granted only where no one holds a shared lock
        except BlockingIOError:
            os.close(fd)
            return True
        self.let_go(fd)
        return False


class MemoryGate:
    """Admits dummy-operand allocations that fit; see the module docstring."""

    POLL_SECONDS = NODE_POLL_SECONDS  # per gate, so that a test may shorten it

    def __init__(self, free: Callable[[torch.device], int] = free_bytes,
                 device_id: Callable[[torch.device], str] = device_uuid) -> None:
        self._free, self._device_id = free, device_id
        self._fresh_state()
        runtime.gates.add(self)
        self.waits = 0  # how many builds waited for others to free memory (tests and debugging)

    def _fresh_state(self) -> None:
        self._cond = threading.Condition()
        self._holding: dict[str, int] = {}  # this process's admitted builds, per GPU
        self._nodes: dict[tuple[str, str], _NodeHolders | None] = {}  # per (BUILDOPS_NODE_LOCKS, GPU)
        self._held: dict[str, list[int]] = {}  # each admitted build's shared lock, per GPU

    def allocate(self, device: torch.device, nbytes: int, make: Callable[[], T], what: str,
                 reserve_mb: int | None = None) -> T:
        """``make()`` the operands once ``nbytes`` fit, leaving ``reserve_mb`` (default: the setting) free; the
        caller must :meth:`release` when done with them."""
        if device.type != "cuda":
            return make()
        reserve = (settings.gpu_reserve_mb if reserve_mb is None else reserve_mb) * _MIB
        waited = False
        with self._cond:
            gpu = self._device_id(device)
            while True:
                node = self._node(gpu)
                if node is not None:
                    try:
                        node.admitting.acquire()
                    except OSError as error:  # the lock directory went away or became unusable
                        self._lose_node(gpu, error)
                        continue
                try:
                    free = self._free(device)
                    if nbytes + reserve <= free:
                        operands = make()  # under the locks: the next check, in any process, sees it
                        self._holding[gpu] = self._holding.get(gpu, 0) + 1
                        self._hold(gpu, node)
                        return operands
                    others = self._others(gpu, node)
                finally:
                    if node is not None:
                        node.admitting.release()
                if not others:
                    raise NotEnoughGpuMemory(
                        f"{what}: dummy operands need {nbytes / _MIB:.0f} MiB, {free / _MIB:.0f} MiB is free and "
                        f"BUILDOPS_GPU_RESERVE_MB keeps {reserve / _MIB:.0f} MiB; it will compile on first use")
                if not waited:
                    waited = True
                    self.waits += 1
                self._cond.wait(timeout=self.POLL_SECONDS if node is not None else LOCAL_POLL_SECONDS)

    def release(self, device: torch.device) -> None:
        """Give back what :meth:`allocate` admitted on ``device`` (its operands already dropped)."""
        if device.type != "cuda":
            return
        with self._cond:
            gpu = self._device_id(device)
            self._holding[gpu] -= 1
            held = self._held.get(gpu)
            if held:
                _NodeHolders.let_go(held.pop())  # any of this GPU's shared locks: they are all alike
            self._cond.notify_all()

    def forget_after_fork(self) -> None:
        """In a forked child: none of the parent's builds run here, and a lock a parent thread held at the fork
        would never be released. The parent's shared locks are closed here, not unlocked: they are the parent's."""
        for fds in self._held.values():
            for fd in fds:
                os.close(fd)
        self._fresh_state()

    def _node(self, gpu: str) -> _NodeHolders | None:
        where = settings.node_locks  # read each time: a scope or a test may change it
        if (where, gpu) not in self._nodes:
            claims = node_claims() if fcntl is not None else None  # None where BUILDOPS_NODE_LOCKS is off
            self._nodes[where, gpu] = _NodeHolders(claims.directory, gpu) if claims is not None else None
        return self._nodes[where, gpu]

    def _hold(self, gpu: str, node: _NodeHolders | None) -> None:
        if node is not None:
            try:
                self._held.setdefault(gpu, []).append(node.hold())
            except OSError as error:
                self._lose_node(gpu, error)

    def _others(self, gpu: str, node: _NodeHolders | None) -> bool:
        """Whether a build that holds operands on the GPU, here or in another process, may still free them."""
        if node is not None:
            try:
                return node.anyone()
            except OSError as error:
                self._lose_node(gpu, error)
        return self._holding.get(gpu, 0) > 0

    def _lose_node(self, gpu: str, error: OSError) -> None:
        logger.warning("buildops: the GPU memory gate cannot use its lock files in BUILDOPS_NODE_LOCKS (%s); it "
                       "counts this process's builds only from now on", error)
        self._nodes[settings.node_locks, gpu] = None


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
    except BaseException as error:
        # The traceback keeps the frames that ran, and the report keeps the error: without this, their references
        # would keep a failed build's operands, GiB perhaps, on the GPU for as long as the process lives.
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        del operands
        gate.release(device)
