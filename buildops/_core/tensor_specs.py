"""What listers receive in place of tensors (:class:`TensorSpec`), and the tensor dims of a swept shape."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorSpec", "tensor_dims"]


def tensor_dims(fitted: Mapping[int | None, int]) -> dict[int, int]:
    """The tensor dims of one argument's entry in :meth:`ResolvedConfig.shapes` (the key None is an int argument's
    own value, never a tensor's)."""
    return {dim: size for dim, size in fitted.items() if dim is not None}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's shape, dtype and device, without its memory: what listers receive in place of tensors."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")

    @classmethod
    def like(cls, tensor: torch.Tensor, dims: Mapping[int, int] | None = None) -> TensorSpec:
        """The spec of ``tensor`` with the given dims replaced."""
        shape = list(tensor.shape)
        for dim, value in (dims or {}).items():
            shape[dim] = value
        return cls(tuple(shape), tensor.dtype, tensor.device)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return torch.Size(self.shape) if dim is None else self.shape[dim]

    def numel(self) -> int:
        return math.prod(self.shape)

    def stride(self) -> tuple[int, ...]:
        """Contiguous strides: a spec describes the tensor the op will be called with, laid out densely."""
        strides, step = [], 1
        for n in reversed(self.shape):
            strides.append(step)
            step *= max(n, 1)
        return tuple(reversed(strides))

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype, device="meta").element_size()

    def meta(self) -> torch.Tensor:
        """A meta tensor of this shape and dtype (no memory)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")
