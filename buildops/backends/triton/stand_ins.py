"""Stand-ins for tensor arguments: what Triton's specialization reads of a tensor, without its memory."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..._core.tensor_specs import TensorSpec
from .versions import POINTER_ALIGNMENT

__all__ = ["PointerArg", "stand_in"]


class PointerArg:
    """What Triton's specialization reads of a tensor argument (its dtype and pointer alignment), without memory.

    Args:
        dtype: the tensor's dtype.
        aligned: whether its data pointer is a multiple of 16 bytes.
    """

    __slots__ = ("dtype", "aligned")

    def __init__(self, dtype: torch.dtype, aligned: bool = True) -> None:
        self.dtype = dtype
        self.aligned = aligned

    def data_ptr(self) -> int:
        return 0 if self.aligned else POINTER_ALIGNMENT // 2

    def __repr__(self) -> str:
        return f"PointerArg({self.dtype}, aligned={self.aligned})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PointerArg) and (self.dtype, self.aligned) == (other.dtype, other.aligned)

    def __hash__(self) -> int:
        return hash((self.dtype, self.aligned))

    def __reduce__(self) -> tuple[Any, ...]:
        return PointerArg, (self.dtype, self.aligned)


def stand_in(arg: Any) -> Any:
    """``arg`` as a build records it: tensors (real, fake, meta), TensorSpecs and dtypes become PointerArgs."""
    if isinstance(arg, torch.Tensor):
        if isinstance(arg, FakeTensor) or arg.device.type == "meta":  # allocations are aligned: the offset decides
            pointer = arg.storage_offset() * arg.element_size()
        else:
            pointer = arg.data_ptr()
        return PointerArg(arg.dtype, pointer % POINTER_ALIGNMENT == 0)
    if isinstance(arg, TensorSpec):
        return PointerArg(arg.dtype, True)
    if isinstance(arg, torch.dtype):
        return PointerArg(arg, True)
    if isinstance(arg, tuple):
        return tuple(stand_in(a) for a in arg)
    return arg
