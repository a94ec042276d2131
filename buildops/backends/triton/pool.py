"""The pool of Triton build worker processes. Torch-free, as the workers' own module is, so that
``startup.start_build_workers()`` can start it before the engine imports torch."""

from __future__ import annotations

from ..._config import settings
from ..._runtime.pools import WorkerPool
from .worker import ready, start

__all__ = ["FORKSERVER_PRELOAD", "FORKSERVER_PRELOAD_FIRST", "workers"]

# What the forkserver that forks the workers imports, in order: Triton, with its install's hash begun on a thread;
# then torch, meanwhile, and a first compile once that hash is done. Never the main module: the pool keeps it out of
# the forkserver's list and out of what each worker is told to import, so a script's module-level code runs once.
FORKSERVER_PRELOAD_FIRST = ("buildops.backends.triton.preload",)
FORKSERVER_PRELOAD = ("buildops.backends.triton.warm",)

# Workers learn the target with each build, not when they start: starting them (maybe before the engine picked its
# GPU) must not initialise CUDA in this process, which asking for the target does.
workers = WorkerPool("Triton build", lambda: settings.threads, start, warm_up=ready,
                     preload=FORKSERVER_PRELOAD, preload_first=FORKSERVER_PRELOAD_FIRST)
