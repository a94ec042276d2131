"""The backends that ship with buildops, registered with the core by name: registering imports no library.

Each backend is a module (or package) of its own, imported only when its library is used: ``triton``,
``flashinfer``, ``deep_gemm`` and ``variants`` (variant recording: a plan's lookups recorded as builds).
"""

from __future__ import annotations

from .._core import extensions

extensions.add_launch_recorder("triton", "buildops.backends.triton.record:recording")
extensions.add_late_watcher("triton", "buildops.backends.triton.late:watch_late_compiles")
extensions.add_late_watcher("triton", "buildops.backends.triton.record:serve_after_passes")  # and late tunings
extensions.add_late_watcher("flashinfer", "buildops.backends.flashinfer:watch_late_compiles")
extensions.add_late_watcher("deep_gemm", "buildops.backends.deep_gemm_late:watch_late_compiles")
