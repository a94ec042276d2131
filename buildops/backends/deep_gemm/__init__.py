"""DeepGEMM builds by running: its kernels compile the first time they run a shape, so a build runs them.

DeepGEMM has no compile-only API. A build here runs one GEMM entry point (``fp8_gemm_nt`` for dense layers,
``m_grouped_fp8_gemm_nt_contiguous`` / ``m_grouped_fp8_gemm_nt_masked`` for MoE experts) on dummy operands, so that
every kernel the layer will need is compiled into DeepGEMM's own cache before serving: where its choice of kernel
is reproduced (``heuristics``), once per kernel of every M up to the bound; elsewhere at every M of a sweep. Dummy
operands are admitted by the GPU memory gate (``BUILDOPS_GPU_RESERVE_MB``) and the runs go on a worker stream.

DeepGEMM's binding holds the GIL while it compiles, so a build on a thread would stop every other Python thread of
the process for the whole compile. Builds therefore run in worker processes (forked from the forkserver, which
imported torch and the workers' code once for all of them), each with its own CUDA context, as many as the builder's
threads and free GPU memory allow, which fill DeepGEMM's disk cache; the process's own first call then loads the
kernel from there (docs/decisions/0013-deep-gemm-in-worker-processes.md, 0025). ``BUILDOPS_EXECUTOR=threads`` keeps
them on the builder's threads instead.

DeepGEMM's process-global settings (``set_num_sms`` and the like) as this process has them when the builds are
made are part of each build's key and are set in the worker before it runs (:mod:`.knobs`).

Its modules: ``shapes`` (a model's GEMM shapes and the Ms each is built at), ``heuristics`` (the kernel DeepGEMM
picks for a call), ``builds`` (a build per kernel or per shape, and the op family), ``runs`` (a build's run),
``workers`` (the worker processes, and how many), ``startup`` (the forkserver they fork from, started early),
``knobs`` (the process-global settings), ``entries`` (a build's cache entries, shared through the build store),
``recipes`` (builds as manifest entries), ``late`` (late compiles), ``versions`` (every other reading of DeepGEMM's
internals: entry points, settings' names, the cache's layout and its entries' code, its compiler and install) and
``state`` (the backend's process-wide state, and what a reset and a fork make it forget).

Imported on demand; ``deep_gemm`` itself is imported only when a build runs. The package imports its modules, and
torch with them, as their names are first used: ``startup`` runs before the engine has imported torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .builds import DeepGemmFamily, deep_gemm_builds
    from .shapes import GemmShape, contiguous_rows, find_gemm_shapes, m_values, shape_ms

_PUBLIC = {
    "DeepGemmFamily": "builds", "deep_gemm_builds": "builds", "GemmShape": "shapes", "contiguous_rows": "shapes",
    "find_gemm_shapes": "shapes", "m_values": "shapes", "shape_ms": "shapes",
}

__all__ = ["DeepGemmFamily", "GemmShape", "contiguous_rows", "deep_gemm_builds", "find_gemm_shapes", "m_values",
           "shape_ms"]


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
