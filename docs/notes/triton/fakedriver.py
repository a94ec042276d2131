"""Minimal fake Triton driver: lets JITFunction.warmup() compile for sm_90 with no GPU.

Works on triton 3.6.0 and 3.7.1 (DriverBase is identical in both).
Anything that would touch a real device (loading the cubin, launching) goes through
`driver.active.utils` / `launcher_cls`; we make those raise LaunchAttempted so a test can
prove that a *real* launch path got as far as the launch (i.e. it found the kernel in cache).
"""
import torch
from triton.backends.driver import DriverBase
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class LaunchAttempted(RuntimeError):
    pass


class FakeCudaDriver(DriverBase):
    def __init__(self, arch=90, warp_size=32, device=0):
        super().__init__()
        self.target = GPUTarget("cuda", arch, warp_size)
        self.device = device

    @classmethod
    def is_active(cls):          # never auto-selected by _create_driver()
        return False

    def map_python_to_cpp_type(self, ty):
        raise NotImplementedError

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_current_device(self):  # used as key of JITFunction.device_caches
        return self.device

    def set_current_device(self, device):
        self.device = device

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return (self.target.arch // 10, self.target.arch % 10)

    def get_benchmarker(self):
        raise NotImplementedError("compile-only driver")

    # Touched only by CompiledKernel._init_handles / launch -> trap it.
    @property
    def utils(self):
        raise LaunchAttempted("real launch reached CompiledKernel._init_handles (kernel was in cache)")

    @property
    def launcher_cls(self):
        raise LaunchAttempted("real launch reached launcher_cls (kernel was in cache)")


def install(arch=90, device=0):
    d = FakeCudaDriver(arch=arch, device=device)
    driver.set_active(d)
    return d
