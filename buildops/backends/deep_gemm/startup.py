"""DeepGEMM's part of an engine's start (:func:`buildops.startup.start_build_workers`): the forkserver its build
workers fork from, started early. Imports no torch: the engine calls it first thing, before its own imports.
"""

from __future__ import annotations

from ..._config import settings
from ..._runtime.main_module import start_forkserver

__all__ = ["FORKSERVER_PRELOAD", "start_workers"]

# What the forkserver imports once for all the workers it forks: their code, and torch with it (.preload); the
# backend's forkserver_preload.
FORKSERVER_PRELOAD = ("buildops.backends.deep_gemm.preload",)


def start_workers() -> bool:
    """Start the forkserver DeepGEMM's build workers fork from, with torch and their code imported there, unless
    builds run on the builder's threads (``BUILDOPS_EXECUTOR=threads``); returns at once (the ``Backend`` contract's
    ``start_workers``).

    The forkserver's import of torch (seconds) then runs beside the engine's own, instead of before a pass's first
    DeepGEMM builds. The workers themselves start with the builds: each holds a CUDA context once it runs one, and
    their number is sized from the GPU memory free then (:mod:`.workers`). A forkserver that runs already (another
    library's, started before :data:`FORKSERVER_PRELOAD` was on its list) is used as it is, and the workers import
    what it lacks themselves.
    """
    if settings.executor == "threads":
        return False
    return start_forkserver(FORKSERVER_PRELOAD)
