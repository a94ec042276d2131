"""Imported by the forkserver that forks Triton build workers, after torch (``_triton_preload`` came before it),
never by users: compile one small kernel, once, so that every worker forked from the forkserver starts
with a first compile's one-time costs paid (Triton's install hashed, LLVM loaded, ptxas asked its version: 0.4-1 s
each otherwise). The forkserver forks workers only once its preload is done, so the hash thread
``_triton_preload`` started ends here first: no worker is forked with a thread running. A failure only leaves
workers to warm themselves; an exception escaping this import would kill the forkserver, so none does.
"""

try:
    from ._triton_preload import hashing

    if hashing is not None:
        hashing.join()
    from ._triton_worker import warm_up_compiler

    warm_up_compiler()
except Exception:  # noqa: BLE001 - see the docstring
    pass
