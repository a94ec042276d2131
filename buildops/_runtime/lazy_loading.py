"""CUDA's lazy loading (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 12.2) of one function at a time.

Under lazy loading a function handle taken from a loaded module may be only partly loaded: the driver finishes
loading it when something needs it, at the latest at its first launch, which for a kernel built ahead is the
engine's first request. :func:`load_function` finishes the load now (``cuFuncLoad``) where it was left;
:func:`function_loaded` only asks (``cuFuncIsLoaded``). Both need a driver of CUDA 12.4 or later, reached through
ctypes as ``libcuda.so.1``, the library torch and Triton load; elsewhere they answer None and do nothing.

Nothing is looked up at import: the driver is opened at the first call, once per process.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any

__all__ = ["function_loaded", "load_function"]

logger = logging.getLogger("buildops")

_LOADED = 1  # CU_FUNCTION_LOADING_STATE_LOADED; 0 is UNLOADED


@functools.cache
def _driver() -> Any:
    """libcuda with ``cuFuncIsLoaded`` and ``cuFuncLoad`` typed, or None where there is none or it lacks them."""
    try:
        library = ctypes.CDLL("libcuda.so.1")  # CDLL hands back the GIL for each call
        is_loaded, load = library.cuFuncIsLoaded, library.cuFuncLoad
    except (OSError, AttributeError):  # no NVIDIA driver here, or one older than CUDA 12.4
        return None
    is_loaded.argtypes, is_loaded.restype = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p], ctypes.c_int
    load.argtypes, load.restype = [ctypes.c_void_p], ctypes.c_int
    return library


def function_loaded(handle: int) -> bool | None:
    """Whether the function ``handle`` (a ``CUfunction``, as an int) is fully loaded; None where the driver
    cannot say (no driver, one older than CUDA 12.4, or an error for this handle)."""
    driver = _driver()
    if driver is None or not handle:
        return None
    state = ctypes.c_int(-1)
    status = driver.cuFuncIsLoaded(ctypes.byref(state), ctypes.c_void_p(handle))
    if status != 0:
        logger.debug("buildops: cuFuncIsLoaded(0x%x) returned CUDA error %d", handle, status)
        return None
    return state.value == _LOADED


def load_function(handle: int) -> bool | None:
    """Finish loading the function ``handle`` (a ``CUfunction``, as an int) where lazy loading left it partly
    loaded. Returns True where this call loaded it, False where it was loaded already, None where the driver
    cannot say or the load failed (then its first launch loads it, or raises there). Never raises."""
    loaded = function_loaded(handle)
    if loaded is not False:
        return None if loaded is None else False
    status = _driver().cuFuncLoad(ctypes.c_void_p(handle))
    if status != 0:
        logger.debug("buildops: cuFuncLoad(0x%x) returned CUDA error %d; its first launch loads it", handle, status)
        return None
    return True
