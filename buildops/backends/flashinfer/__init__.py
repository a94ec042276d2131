"""FlashInfer JIT modules, built compile-only with FlashInfer's own machinery and lock.

A build takes FlashInfer's per-module file lock (``JitSpec.lock_path``, the one ``build_and_load`` takes) and runs
``JitSpec.build``: ninja and nvcc write the module into FlashInfer's JIT cache, and nothing is loaded. The first
call that needs the module loads it: its ``build_and_load`` runs ninja, finds the outputs up to date and compiles
nothing. That holds only if the later call sees the same build description: the same environment (FlashInfer's
``FLASHINFER_*`` build settings, ``CUDA_HOME``), the same ``ninja``, the same workspace.

With a build store (``BUILDOPS_STORE``), an nvcc module's library is shared across nodes
(:mod:`.store`): a node that fetches it runs no ninja for it, in its build or in the first call.

Two processes building one module take turns on the lock; the second finds it built. Builds run on the builder's
threads (ninja and nvcc are subprocesses, so the GIL is free); at most one per 4 GiB of memory runs at once, since
one nvcc of an attention module can take several GiB.

:data:`PLAN_LOOKUPS` are the module getters a FlashInfer attention wrapper's ``plan()`` calls; with
:func:`buildops.backends.variants.variants` they turn a plan into the builds of the modules it would need.

Its modules: ``builds`` (module builds, their runs and the late-compile watch), ``store`` (a module's library
shared through the build store), ``build_patch`` (the patches of ``JitSpec.build``, released in order),
``versions`` (every reading of FlashInfer's internals, by version) and ``state`` (the backend's process-wide state,
and what a reset and a fork make it forget).

Imported on demand; FlashInfer reads its build settings when it is imported.
"""

from __future__ import annotations

from .builds import PLAN_LOOKUPS, jit_directory, module_builds, watch_late_compiles

__all__ = ["PLAN_LOOKUPS", "jit_directory", "module_builds", "watch_late_compiles"]
