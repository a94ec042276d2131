"""Call signatures: what identifies a call of an op apart from its swept dims, and their readable form.

In a pass the first call per call signature lists its builds; outside one, a call waits for its own signature's
builds. A signature is a hashable tuple of ``(argument name, key)`` pairs, compared on every such call. It must be
at least as fine as what the op's kernels compile for (two calls that need different kernels never share one), and
should be no finer than the op's host code can tell apart (64 equal layers list once):

  * A tensor by dtype, device type, shape pattern (``None`` where swept), contiguity and whether its data pointer
    is a multiple of 16 bytes (Triton compiles aligned and unaligned pointers apart).
  * A bool, int or float by its type and value. That is finer than Triton's own specialization of a kernel
    argument (bool; int32, int64 or uint64, each apart where equal to 1 and where a multiple of 16; fp32 for any
    float), which a value and its type determine. Finer on purpose: an op's scalar need not reach a kernel as a
    plain argument. Host code turns bools into constexpr flags (``IS_CAUSAL=causal``), floats into branches
    (``softcap > 0``) and ints into block sizes (``next_power_of_2(head_dim)``), so values that Triton would
    treat alike as kernel arguments can still compile apart.
  * An ``nn.Module`` (``self`` of a method op) by its class and what compiling can depend on: its parameters' and
    buffers' keys as tensors (not their values), its plain attributes, and its submodules, recursively.
  * Lists, tuples and dicts by their items; other hashable values by value; anything else by identity.

The readable form (:class:`Signature`) is what ``ListingRecorder.signatures()`` returns for tests to assert on.
"""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ModuleSignature", "Signature", "TensorSignature", "call_signature", "readable"]

# Triton specializes a pointer argument on whether its data pointer is a multiple of this (its adapter,
# backends/triton/versions.py, names it too; this layer imports no Triton)
_ALIGNMENT = 16
# A "position" of ResolvedConfig.swept(): the argument is named in static= and is left out of the signature.
STATIC = -2


class _Kind(enum.Enum):
    """Tags the structured keys, so that no plain value is taken for one and the readable form can decode them."""

    TENSOR = "tensor"
    SCALAR = "scalar"
    SEQUENCE = "sequence"
    MAPPING = "mapping"
    MODULE = "module"
    IDENTITY = "identity"


class _CallSignature(tuple):
    """A call signature: ``((argument name, key), ...)``. It hashes and compares as the plain tuple it is; its type
    tells the readable form apart from the signatures families give their listings (plain values)."""

    __slots__ = ()


def call_signature(bound: Mapping[str, Any], swept: Mapping[str, set[int]]) -> tuple:
    """What identifies a call apart from its swept dims.

    A signature may split where Triton would compile one kernel: scalars count by value, and an op cannot know a
    kernel's ``do_not_specialize``. That only lists a shape twice; both listings' builds share their keys, and each
    key is built once.

    Args:
        bound: the call's arguments by name, defaults applied.
        swept: per argument, the positions of its swept dims (``ResolvedConfig.swept``): ``-1`` for an int argument
            that is itself swept (its key is ``None``), :data:`STATIC` for an argument left out.
    """
    parts = []
    for name, value in bound.items():
        positions = swept.get(name)
        if positions is None:
            parts.append((name, static_key(value)))
        elif STATIC in positions:
            continue
        elif -1 in positions:
            parts.append((name, None))
        else:
            shape = tuple(None if i in positions else n for i, n in enumerate(value.shape))
            parts.append((name, _tensor_key(value, shape)))
    return _CallSignature(parts)


def static_key(value: Any) -> Hashable:
    """A hashable stand-in for an argument that is not swept: equal for values that make the same kernels."""
    return _key(value, set())


def _key(value: Any, seen: set[int]) -> Hashable:
    if isinstance(value, (bool, int, float)):
        # by type too: 1, 1.0 and True are equal in Python, but compile apart (constexpr 1, fp32, bool)
        return (_Kind.SCALAR, type(value), "nan" if value != value else value)  # NaN equals nothing, itself included
    if isinstance(value, torch.Tensor):
        return _tensor_key(value, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return (_Kind.SEQUENCE, type(value), tuple(_key(v, seen) for v in value))
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return (_Kind.MAPPING, tuple((_key(k, seen), _key(v, seen)) for k, v in items))
    if isinstance(value, torch.nn.Module):
        return _module_key(value, seen)
    try:
        hash(value)
    except TypeError:
        return (_Kind.IDENTITY, type(value), id(value))
    return value


def _tensor_key(tensor: torch.Tensor, shape: tuple[int | None, ...]) -> tuple:
    return (_Kind.TENSOR, tensor.dtype, tensor.device.type, shape, tensor.is_contiguous(), _aligned(tensor))


def _aligned(tensor: torch.Tensor) -> bool:
    """Whether the tensor's data pointer is a multiple of 16 bytes, as Triton's specialization reads it."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")  # imported wherever a fake tensor exists
    try:
        if tensor.device.type == "meta" or (fake is not None and isinstance(tensor, fake.FakeTensor)):
            # no memory: allocations are aligned, so the view's offset decides (as the Triton backend's stand-ins)
            return tensor.storage_offset() * tensor.element_size() % _ALIGNMENT == 0
        return tensor.data_ptr() % _ALIGNMENT == 0
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, some subclasses)
        return True


@functools.cache
def _module_internals() -> frozenset[str]:
    """What ``nn.Module.__init__`` puts in every module's ``__dict__`` (hooks, registries), ``training`` aside."""
    return frozenset(vars(torch.nn.Module())) - {"training"}


def _module_key(module: torch.nn.Module, seen: set[int]) -> tuple:
    """A module by its class and state that compiling can depend on. Recomputed per call: shapes can change."""
    if id(module) in seen:  # a module that holds an ancestor: that one is keyed already
        return (_Kind.IDENTITY, type(module), id(module))
    seen.add(id(module))
    try:
        internals = _module_internals()
        state: list[tuple[str, Hashable]] = []
        for name, tensor in (*module._parameters.items(), *module._buffers.items()):
            state.append((name, None if tensor is None else _tensor_key(tensor, tuple(tensor.shape))))
        state += [(name, _key(v, seen)) for name, v in vars(module).items() if name not in internals]
        state += [(name, None if sub is None else _module_key(sub, seen)) for name, sub in module._modules.items()]
        return (_Kind.MODULE, type(module), tuple(state))
    finally:
        seen.discard(id(module))


# -- the readable form ------------------------------------------------------------------------------------------

def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, eq=False, init=False)
class TensorSignature:
    """A tensor argument as a call signature sees it.

    It equals another ``TensorSignature`` with the same fields, or a tuple ``(dtype, device, shape)`` with
    ``contiguous`` and ``aligned`` optionally after it (left out, they are True): so a test can write
    ``("float16", "cuda", (None, 4096))``. Dtypes and devices may be given as torch objects.

    Args:
        dtype: the dtype's name, e.g. ``"float16"`` (or a ``torch.dtype``).
        device: the device type, e.g. ``"cuda"`` (or a ``torch.device``, or ``"cuda:1"``).
        shape: the sizes, ``None`` for a swept dim.
        contiguous: whether the tensor is contiguous.
        aligned: whether its data pointer is a multiple of 16 bytes.
    """

    dtype: str
    device: str
    shape: tuple[int | None, ...]
    contiguous: bool = True
    aligned: bool = True

    def __init__(self, dtype: str | torch.dtype, device: str | torch.device, shape: Sequence[int | None],
                 contiguous: bool = True, aligned: bool = True) -> None:
        device = device.type if isinstance(device, torch.device) else str(device)
        for name, value in (("dtype", _dtype_name(dtype)), ("device", device.partition(":")[0]),
                            ("shape", tuple(shape)), ("contiguous", contiguous), ("aligned", aligned)):
            object.__setattr__(self, name, value)  # frozen: set once, here

    def _fields(self) -> tuple:
        return (self.dtype, self.device, self.shape, self.contiguous, self.aligned)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list)):
            if not 3 <= len(other) <= 5:
                return False
            try:
                other = TensorSignature(*other)
            except (TypeError, ValueError):
                return False
        if not isinstance(other, TensorSignature):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        # the tuple a test would write: the flags only where they are not True
        fields = [self.dtype, self.device, self.shape]
        if not self.aligned:
            fields += [self.contiguous, False]
        elif not self.contiguous:
            fields.append(False)
        return repr(tuple(fields))


class ModuleSignature:
    """A module argument (``self`` of a method op) as a call signature sees it: its class and state.

    The state holds its parameters and buffers (as :class:`TensorSignature`), its plain attributes (``training``
    among them, True when left out) and its submodules (as ``ModuleSignature``); ``sig["weight"]`` reads one. It
    equals a ``ModuleSignature`` of the same class and state, or the class itself (any state):
    ``Signature(self=RMSNorm, x=...)``.

    Args:
        cls: the module's class.
        state: its state by name.
    """

    __slots__ = ("cls", "state")

    def __init__(self, cls: type, /, **state: Any) -> None:
        state.setdefault("training", True)
        self.cls = cls
        self.state: Mapping[str, Any] = state

    def __getitem__(self, name: str) -> Any:
        return self.state[name]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type):
            return self.cls is other
        if not isinstance(other, ModuleSignature):
            return NotImplemented
        return self.cls is other.cls and _same(dict(self.state), dict(other.state))

    def __hash__(self) -> int:
        return hash((self.cls, tuple(sorted(self.state))))

    def __repr__(self) -> str:
        state = [f"{k}={v!r}" for k, v in self.state.items() if not (k == "training" and v is True)]
        return f"ModuleSignature({self.cls.__qualname__}{''.join(', ' + s for s in state)})"


class ByIdentity:
    """A value a signature keys by identity (it is unhashable): equal to that very object.

    Args:
        cls: the object's class.
        ident: its ``id()``.
    """

    __slots__ = ("cls", "ident")

    def __init__(self, cls: type, ident: int) -> None:
        self.cls = cls
        self.ident = ident

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ByIdentity):
            return self.ident == other.ident
        return id(other) == self.ident and type(other) is self.cls

    def __hash__(self) -> int:
        return hash(self.ident)

    def __repr__(self) -> str:
        return f"<{self.cls.__qualname__} object at {self.ident:#x}>"


class Signature(Mapping[str, Any]):
    """A call signature as a test reads it: the op's arguments by name (``self`` too, for a method).

    A tensor is a :class:`TensorSignature`, a module a :class:`ModuleSignature`, a swept int ``None``; other values
    are themselves (lists, tuples and dicts with their items in readable form). Arguments named in ``static=`` are
    not in it. Its repr is a call a test can paste::

        Signature(x=('float16', 'cpu', (None, 4096)), weight=('float16', 'cpu', (4096,)), eps=1e-06)

    It equals another ``Signature``, or a dict, with the same names and equal values; a tuple for a tensor, and the
    class for a module, as their types say. Bools, ints and floats are equal only to their own kind (``True`` is
    not ``1``): they are different signatures.

    Args:
        arguments: the arguments by name, as a mapping, keywords, or both.
    """

    __slots__ = ("_arguments",)

    def __init__(self, arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._arguments = {**(arguments or {}), **kwargs}

    def __getitem__(self, name: str) -> Any:
        return self._arguments[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arguments)

    def __len__(self) -> int:
        return len(self._arguments)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return _same(self._arguments, dict(other))

    def __hash__(self) -> int:  # equal signatures have equal names; dicts that equal one are not hashable anyway
        return hash(tuple(self._arguments))

    def __repr__(self) -> str:
        return f"Signature({', '.join(f'{k}={v!r}' for k, v in self._arguments.items())})"


def _same(a: Any, b: Any) -> bool:
    """Equality as signatures see it: bools, ints and floats only to their own kind; containers item by item."""
    if isinstance(a, (bool, int, float)) and isinstance(b, (bool, int, float)):
        return _kind(a) is _kind(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _kind(value: bool | int | float) -> type:
    return bool if isinstance(value, bool) else int if isinstance(value, int) else float


def readable(signature: Hashable) -> Any:
    """The readable form of a call signature (a :class:`Signature`); any other signature (a family's) as it is."""
    if not isinstance(signature, _CallSignature):
        return signature
    return Signature({name: _readable(key) for name, key in signature})


def _readable(key: Any) -> Any:
    if not (isinstance(key, tuple) and key and isinstance(key[0], _Kind)):
        return key  # a plain hashable value, or None for a swept int
    kind = key[0]
    if kind is _Kind.TENSOR:
        _, dtype, device, shape, contiguous, aligned = key
        return TensorSignature(_dtype_name(dtype), device, shape, contiguous, aligned)
    if kind is _Kind.SCALAR:
        return float("nan") if key[2] == "nan" else key[2]
    if kind is _Kind.SEQUENCE:
        items = [_readable(k) for k in key[2]]
        return items if issubclass(key[1], list) else tuple(items)
    if kind is _Kind.MAPPING:
        return {_readable(k): _readable(v) for k, v in key[1]}
    if kind is _Kind.MODULE:
        return ModuleSignature(key[1], **{name: _readable(k) for name, k in key[2]})
    return ByIdentity(key[1], key[2])
