"""What ``buildops doctor`` shows of Triton (the ``Backend`` contract's ``cache`` and ``describe``)."""

from __future__ import annotations

from ..._config import settings

__all__ = ["cache", "describe"]


def cache() -> str:
    """Triton's kernel cache directory (``TRITON_CACHE_DIR``, or Triton's default)."""
    from triton import knobs

    return knobs.cache.dir


def describe() -> dict[str, str]:
    """The target buildops' Triton builds compile for: the GPU's, or where Triton finds no GPU driver,
    ``BUILDOPS_TRITON_TARGET`` (builds then compile only)."""
    from .driver import CompileOnlyDriver, active_driver

    try:
        current = active_driver().get_current_target()
    except RuntimeError:  # "0 active drivers": no GPU; buildops installs its compile-only driver when it builds
        backend, arch = settings.triton_target
        return {"target": f"{backend}:{arch} (compile-only: no GPU driver, from BUILDOPS_TRITON_TARGET)"}
    if isinstance(active_driver(), CompileOnlyDriver):
        return {"target": f"{current.backend}:{current.arch} (compile-only: no GPU driver, from "
                          f"BUILDOPS_TRITON_TARGET)"}
    return {"target": f"{current.backend}:{current.arch} (this GPU's)"}
