"""Torch custom ops in a replay: each call is routed to the custom op's own Python implementation, so that the
kernels it launches are recorded.

On meta or fake tensors a ``torch.library`` custom op runs its fake implementation (``register_fake``), which
launches nothing: an op whose kernels sit behind custom ops (as in vLLM and SGLang) would list nothing. While a
replay runs, :class:`CustomOpRouter` (a ``TorchFunctionMode``, so it sees the call before any dispatch and above
``FakeTensorMode``) calls instead the Python function registered for the device the call's tensors are on (that
device's, else the default one), on the same stand-in tensors.

Where torch keeps the implementations (private names: tested on torch 2.13; older 2.x sources have them too, since
``custom_op`` appeared in 2.4; where one is missing, the custom op runs its fake, as it would without buildops):
  * ``torch.library.custom_op``: its ``CustomOpDef`` (``torch._library.custom_ops._maybe_get_opdef``) keeps the
    Python function per device type in ``_backend_fns`` (the key ``None``: every device).
  * ``torch.library.Library.impl`` and ``torch.library.impl``: the function goes into the dispatcher, and
    ``torch.library._impls`` records each ``"namespace/op/DispatchKey"`` that got a Python kernel; that kernel is
    called through ``torch._C._dispatch_get_computed_kernel_for_dispatch_key(...).call_boxed``.
A kernel registered from C++ (``TORCH_LIBRARY_IMPL``) is never called on stand-ins: the call runs its fake
implementation, and the router notes why (:attr:`CustomOpRouter.unrouted`) for the replay's warning or error.

**aten overrides.** A library may register Python kernels for torch's own ops (``torch.library.Library("aten",
"IMPL")``), so that ``torch.nn.functional.silu`` on a CUDA tensor runs its Triton kernel. Host code reaches those
through torch's functions, which a ``TorchFunctionMode`` sees only as ``torch.nn.functional.silu``, and on stand-ins
the dispatcher takes the meta or fake kernel. :class:`AtenOverrideRouter` (a ``TorchDispatchMode``, which sees each
aten op the dispatcher runs) calls instead the Python kernel registered for the call's device. It is active only
where some aten op has one (:func:`aten_overrides`); torch's C++ kernels are never called on stand-ins.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .state import core

__all__ = ["AtenOverrideRouter", "CustomOpRouter", "aten_overrides", "implementation"]

# Torch's own namespaces: their ops have no Python implementation worth routing to (and many calls to check).
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "_c10d_functional", "c10d", "profiler", "debugprims"})
# Dispatch keys whose kernel serves every device: a "default" implementation.
_DEFAULT_KEYS = ("CompositeExplicitAutograd", "CompositeImplicitAutograd")
# The backends' dispatch keys tried for a call whose device is unknown (its tensors are on meta).
_BACKEND_KEYS = ("CUDA", "CPU", "XPU", "HIP", "MPS")


def _overload(func: Any, args: tuple, kwargs: dict) -> torch._ops.OpOverload | None:
    """The custom op a torch function call is, or None (a torch op, or not an op at all)."""
    if isinstance(func, torch._ops.OpOverload):
        return None if func.namespace in _TORCH_NAMESPACES else func
    if isinstance(func, torch._ops.OpOverloadPacket):
        namespace = func._qualified_op_name.partition("::")[0]
        if namespace in _TORCH_NAMESPACES:
            return None
        try:  # the overload the dispatcher would pick for these arguments
            name = torch._C._jit_resolve_packet(func._qualified_op_name, *args, **kwargs)
        except Exception:  # noqa: BLE001 - arguments no overload takes: the call raises its own error
            return None
        return getattr(func, name or "default", None)
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _device_type(args: tuple, kwargs: dict) -> str | None:
    """The device type a call's tensors are on (a factory op's ``device`` argument where it has no tensor)."""
    for value in (*args, *kwargs.values()):
        for tensor in _tensors(value):
            return tensor.device.type
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.device):
            return value.type
    return None


def _python_dispatcher_kernel(op: torch._ops.OpOverload, key: str, device_key: str | None
                              ) -> Callable[..., Any] | None | bool:
    """The Python kernel ``Library.impl`` registered for ``op`` at dispatch key ``key``: a callable; False when
    the kernel there is not Python (C++); None when there is none. ``device_key`` is the runtime key to call an
    alias key's kernel (``CompositeExplicitAutograd``) through, None for one whose own kernel is not there."""
    qualname = op._name  # "namespace::name" or "namespace::name.overload"
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key):
        return None
    impls = getattr(torch.library, "_impls", None)  # torch's record of the kernels registered from Python
    namespace, _, name = qualname.partition("::")
    names = (name, f"{name}.default") if op._overloadname == "default" else (name,)
    if impls is None or not any(f"{namespace}/{n}/{key}" in impls for n in names):
        return False
    runtime = key
    if key in _DEFAULT_KEYS:  # an alias key has no kernel of its own to call: a backend key that falls back to it
        runtime = device_key or next((k for k in _BACKEND_KEYS
                                      if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, k)), "")
        if not runtime:
            return None
    kernel = torch._C._dispatch_get_computed_kernel_for_dispatch_key(qualname, runtime)
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, runtime))

    def call(*args: Any, **kwargs: Any) -> Any:
        return kernel.call_boxed(keyset, *args, **kwargs)
    return call


def implementation(op: torch._ops.OpOverload, device: str | None) -> tuple[Callable[..., Any] | None, str]:
    """The Python function that runs ``op`` on ``device`` (a device type; ``"meta"``, or None, when the call's
    device is unknown), and where it was found; or None and why there is none.

    For a known device: that device's implementation, else the default one. For an unknown device: the default
    one, else the only device's implementation there is.
    """
    try:
        return _implementation(op, device)
    except (AttributeError, ImportError) as error:  # a torch whose private records differ from 2.13's
        return None, f"this torch keeps its implementations where buildops does not look ({error})"


def _implementation(op: torch._ops.OpOverload, device: str | None) -> tuple[Callable[..., Any] | None, str]:
    from torch._library.custom_ops import _maybe_get_opdef

    known = device not in (None, "meta")
    opdef = _maybe_get_opdef(op)
    if opdef is not None:  # torch.library.custom_op
        fns = opdef._backend_fns
        if known and device in fns:
            return fns[device], f"its {device} implementation"
        if None in fns:
            return fns[None], "its default implementation"
        devices = [d for d in fns if d is not None]
        if not known and len(devices) == 1:
            return fns[devices[0]], f"its {devices[0]} implementation (the only one)"
        return None, (f"it has no Python implementation for {device}" if known else
                      f"its tensors are on meta, and it has implementations for {devices}, not one default one")
    device_key = None
    if known:
        try:
            device_key = torch._C._dispatch_key_for_device(device)
        except RuntimeError:  # a device type the dispatcher does not know
            pass
    cpp = []
    for key in ([device_key] if device_key else []) + list(_DEFAULT_KEYS):
        kernel = _python_dispatcher_kernel(op, key, device_key)
        if callable(kernel):
            return kernel, f"its Python kernel for {key}"
        if kernel is False:
            cpp.append(key)
    if not known:
        found = [(key, kernel) for key in _BACKEND_KEYS
                 if callable(kernel := _python_dispatcher_kernel(op, key, None))]
        if len(found) == 1:
            return found[0][1], f"its Python kernel for {found[0][0]} (the only one)"
    if cpp:
        return None, f"its kernel for {cpp[0]} is not Python (a C++ kernel)"
    return None, f"it has no kernel for {device}" if known else "it has no default kernel"


class CustomOpRouter(TorchFunctionMode):
    """While active, a call to a torch custom op runs the op's Python implementation for the call's device, on the
    call's own (stand-in) tensors; torch's own ops run as usual.

    Args:
        device: the device type of the call being replayed, which meta tensors stand for (None: unknown).
    """

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.device = device
        self.routed: dict[str, str] = {}  # custom op -> where its implementation was found
        self.unrouted: dict[str, str] = {}  # custom op -> why it ran its fake implementation instead

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _overload(func, args, kwargs)
        if op is None:
            return func(*args, **kwargs)
        device = _device_type(args, kwargs)
        if device == "meta":
            device = self.device
        impl, where = implementation(op, device)
        name = op._name
        if impl is None:
            self.unrouted.setdefault(name, where)
            return func(*args, **kwargs)
        self.routed.setdefault(name, where)
        with self:  # the mode is off inside its own handler: custom ops the implementation calls are routed too
            return impl(*args, **kwargs)

    def describe_unrouted(self) -> str:
        """The custom ops that ran their fake implementation, and why, for a warning or an error."""
        return "; ".join(f"custom op {name} ran its fake implementation: {why}"
                         for name, why in self.unrouted.items())


def _registered_by_a_library(entry: str) -> bool:
    """Whether the Python kernel of torch's record ``"aten/name/Key"`` was registered by a library rather than by
    torch itself (its meta functions, a few of its own kernels): where the dispatcher says it was registered."""
    known = core.library_kernels.get(entry)  # judged once per entry
    if known is not None:
        return known
    _, name, key = entry.split("/")
    judged = True  # where the dispatcher cannot tell, route it: the real call runs that kernel too
    if key == "Meta":
        judged = False
    else:
        try:
            own = os.path.dirname(torch.__file__) + os.sep
            for line in torch._C._dispatch_dump(f"aten::{name}").splitlines():
                if line.startswith(f"{key}: registered at "):
                    judged = not line.partition("registered at ")[2].startswith(own)
                    break
        except Exception:  # noqa: BLE001 - a torch without the dump: see above
            pass
    core.library_kernels[entry] = judged
    return judged


def aten_overrides() -> frozenset[str]:
    """The aten ops (``"silu"``, ``"add.Tensor"``) that some library gave a Python kernel for a device, from
    torch's record of the Python kernels; torch's own (its meta functions) left out."""
    impls = getattr(torch.library, "_impls", None)
    if not impls:
        return frozenset()
    # Read once per size of the record: every replay asks, and registrations come and go as a whole library
    size, overridden = core.aten_overrides
    if size != len(impls):
        overridden = frozenset(entry.split("/")[1] for entry in list(impls) if entry.startswith("aten/")
                               and entry.count("/") == 2 and _registered_by_a_library(entry))
        core.aten_overrides = (len(impls), overridden)
    return overridden


class AtenOverrideRouter(TorchDispatchMode):
    """While active, an aten op that a library overrode from Python runs that Python kernel for the call's device,
    on the call's own (stand-in) tensors; every other op runs as usual.

    Args:
        device: the device type of the call being replayed, which meta tensors stand for (None: unknown).
        overridden: the aten ops with a Python kernel (:func:`aten_overrides`).
    """

    def __init__(self, device: str | None, overridden: frozenset[str]) -> None:
        super().__init__()
        self.device = device
        self.overridden = overridden

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._name.partition("::")[2]  # "silu" for the default overload, "add.Tensor" for another
        if name not in self.overridden and f"{name}.default" not in self.overridden:
            return func(*args, **kwargs)
        device = _device_type(args, kwargs)
        if device == "meta":
            device = self.device
        impl, _ = implementation(func, device)
        if impl is None:  # torch's own kernel for this device: the stand-ins' meta or fake one runs
            return func(*args, **kwargs)
        with self:  # off inside its own handler: the aten ops the override calls are routed too
            return impl(*args, **kwargs)
