"""The pool of Triton build worker processes. Torch-free, as the workers' own module is, so that
``startup.start_build_workers()`` can start it before the engine imports torch."""

from __future__ import annotations

from ._config import settings
from ._pools import WorkerPool
from ._triton_worker import ready, start

__all__ = ["FORKSERVER_PRELOAD", "workers"]

# What the forkserver that forks the workers imports first: torch, Triton and a first compile.
FORKSERVER_PRELOAD = ("buildops._triton_preload",)

# Workers learn the target with each build, not when they start: starting them (maybe before the engine picked its
# GPU) must not initialise CUDA in this process, which asking for the target does.
workers = WorkerPool("Triton build", lambda: settings.threads, start, warm_up=ready, preload=FORKSERVER_PRELOAD)
