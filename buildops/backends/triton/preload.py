"""Imported by the forkserver that forks Triton build workers (``WorkerPool(preload_first=...)``), never by users:
first, before ``warm``, which imports torch and ends the thread begun here.

Here the forkserver imports Triton and starts hashing its install on a thread of its own (``triton_key``: Triton's
sources and its libtriton, which a first compile needs). Reads and hashlib release the GIL, so the hash runs while
the forkserver's main thread imports torch, and every worker forked from the forkserver starts with it done
(docs/decisions/0002-forkserver-preload.md). A failure here only leaves the hash to the warm-up compile; an exception
escaping this import would kill the forkserver, so none does. Torch-free: the forkserver imports it before torch.
"""

import threading


def _hash_quietly() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # cached for the process, and so for every worker forked from it
    except Exception:  # noqa: BLE001 - see the docstring
        pass


hashing: threading.Thread | None = None
try:
    import triton.runtime.cache  # noqa: F401 - imported here, on the main thread: never two threads importing it

    hashing = threading.Thread(target=_hash_quietly, name="buildops-hash-triton", daemon=True)
    hashing.start()
except Exception:  # noqa: BLE001 - see the docstring
    hashing = None
