"""Imported by the forkserver that forks Triton build workers (``WorkerPool(preload=...)``), never by users.

Importing torch and Triton, and compiling one small kernel (a first compile hashes Triton's install and loads
LLVM: 0.4-1 s), once in the forkserver means every worker forked from it starts with all of that done, instead of
each paying seconds of CPU. A failure here only leaves workers to warm themselves; an exception escaping this
import would kill the forkserver, so none does.
"""

try:
    from ._triton_worker import warm_up_compiler

    warm_up_compiler()
except Exception:  # noqa: BLE001 - see the docstring
    pass
