"""Imported by the forkserver that forks DeepGEMM's build workers (``WorkerPool(preload=...)``), never by users: the
workers' own code, and torch with it, imported there once instead of by every worker of a pool starting at once
(docs/decisions/0002-forkserver-preload.md). DeepGEMM itself is not: its import initialises its extension, and a
forkserver must not hold anything of CUDA's that its children would inherit; each worker imports it at its first run.

Nothing may escape this import: the forkserver ignores only ImportError, and dies of anything else (a torch whose CUDA
libraries fail to load raises OSError), which would fail every DeepGEMM build; here such a failure only leaves the
workers to import the rest themselves, as spawned ones do.
"""

try:
    from . import runs  # noqa: F401 - for the workers
except Exception:  # noqa: BLE001 - see the docstring
    pass
