"""The target Triton compiles for, and a driver for machines without a GPU."""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from ..._config import settings
from ..._runtime.forking import free_in_child

__all__ = ["CompileOnlyDriver", "active_driver", "compile_only", "inner_jit", "kernel_name", "target"]

logger = logging.getLogger("buildops")


class CompileOnlyDriver(DriverBase):
    """A Triton driver that compiles for a fixed target and refuses to load or launch: for machines without a GPU.

    buildops installs it only when Triton finds no driver (``0 active drivers``); the target comes from
    ``BUILDOPS_TRITON_TARGET`` (default ``cuda:90``).

    Args:
        backend: Triton's backend name, e.g. ``cuda``.
        arch: the architecture, e.g. 90 for compute capability 9.0.
        warp_size: threads per warp (default: 32 for ``cuda``, 64 otherwise).
    """

    # DriverBase's abstract methods carry no annotations, so pyright infers that they return None: the overrides
    # below that return something ignore that one rule.

    def __init__(self, backend: str, arch: int, warp_size: int | None = None) -> None:
        super().__init__()
        self.arch = arch
        self.target = GPUTarget(backend, arch, warp_size or (32 if backend == "cuda" else 64))

    @classmethod
    def is_active(cls) -> bool:  # pyright: ignore[reportIncompatibleMethodOverride]
        return False  # never picked by Triton's own driver discovery

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("compile-only driver")

    def get_current_target(self) -> GPUTarget:  # pyright: ignore[reportIncompatibleMethodOverride]
        return self.target

    def get_active_torch_device(self) -> torch.device:  # pyright: ignore[reportIncompatibleMethodOverride]
        return torch.device("cpu")

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return divmod(self.arch, 10)

    def get_benchmarker(self) -> Any:
        raise RuntimeError("buildops compile-only Triton driver: there is no GPU to benchmark on")

    @property
    def utils(self) -> Any:
        raise RuntimeError("buildops compile-only Triton driver: kernels are compiled here, never loaded or launched")

    @property
    def launcher_cls(self) -> Any:
        raise RuntimeError("buildops compile-only Triton driver: kernels are compiled here, never loaded or launched")


_driver_lock = free_in_child(threading.Lock())


def active_driver() -> Any:
    """Triton's active driver. Typed ``Any``: Triton types it as ``DriverBase``, which declares none of the methods
    that its drivers have and buildops calls (``get_current_device``, ``launcher_cls``, ...)."""
    return driver.active


def target() -> GPUTarget:
    """The target Triton compiles for here: the current GPU's, or ``BUILDOPS_TRITON_TARGET`` without a GPU."""
    try:
        return active_driver().get_current_target()
    except RuntimeError:  # "0 active drivers": no GPU here
        with _driver_lock:
            try:
                return active_driver().get_current_target()
            except RuntimeError:
                backend, arch = settings.triton_target
                driver.set_active(CompileOnlyDriver(backend, arch))
                logger.info("buildops: no GPU driver; Triton builds compile for %s:%d", backend, arch)
                return active_driver().get_current_target()


def compile_only() -> bool:
    """Whether Triton compiles here through :class:`CompileOnlyDriver` (no GPU)."""
    return isinstance(driver.active, CompileOnlyDriver)


def inner_jit(kernel: Any) -> JITFunction:
    """The ``JITFunction`` under a kernel's wrappers (``@triton.autotune``, ``@triton.heuristics``)."""
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def kernel_name(jit: JITFunction) -> str:
    """The kernel's qualified name, ``module.qualname``, as builds and late compiles report it."""
    return f"{jit.fn.__module__}.{jit.fn.__qualname__}"
