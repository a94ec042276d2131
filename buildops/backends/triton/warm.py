"""Imported by the forkserver that forks Triton build workers, after ``preload``, never by users: import torch
while the hash that module began runs, then compile one small kernel, once, so that every worker forked from the
forkserver starts with a first compile's one-time costs paid: Triton's install hashed, LLVM loaded, ptxas asked its
version (docs/decisions/0002-forkserver-preload.md).

The forkserver forks workers only once its preload is done, and the hash thread ends here first, however the
torch import ends: no worker is forked with a thread running. Nothing may escape this import: the forkserver
ignores only ImportError, and dies of anything else (a torch whose CUDA libraries fail to load raises OSError),
which would fail every Triton build; here such a failure only leaves workers to import and warm themselves.
"""

try:
    try:
        import torch  # noqa: F401 - for the workers, and while the hash runs
    except Exception:  # noqa: BLE001 - see the docstring
        pass
    finally:
        from .preload import hashing

        if hashing is not None:
            hashing.join()
    from .worker import warm_up_compiler

    warm_up_compiler()
except Exception:  # noqa: BLE001 - see the docstring
    pass
