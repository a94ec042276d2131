"""What an op returns inside a pass, where it does not run: zeros like an argument, what a callable of the arguments
makes, nothing, or (``output`` left out) what a replay of the op's host code at the call's own shapes returned,
as zeros. One :class:`Placeholders` per op."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from types import EllipsisType
from typing import Any, TypeAlias

import torch

from .listing import materialize, output_template
from .signatures import call_signature
from .specs import SpecError

__all__ = ["Output", "Placeholders"]

# ``...`` (the default of @lists_kernels): the placeholder is inferred from a replay of the op's host code
Output: TypeAlias = str | Callable[..., Any] | EllipsisType | None

# Inferred placeholder templates an op keeps (by full signature) before starting over
TEMPLATES_KEPT = 256
_MISSING = object()


class Placeholders:
    """An op's placeholder outputs. ``output`` is the decorator's; ``infers`` whether a replay may give one."""

    def __init__(self, op: str, fn: Callable, output: Output, decorator: str) -> None:
        self.op, self.fn, self.output, self.decorator = op, fn, output, decorator
        self._templates: dict[Hashable, Any] = {}  # inferred templates by the call's full signature

    def of(self, bound: inspect.BoundArguments, infers: bool) -> Any:
        """The placeholder for one call in a pass."""
        output = self.output
        if output is None:
            return None
        if isinstance(output, str):
            return torch.zeros_like(bound.arguments[output])
        if output is not ...:
            return output(*bound.args, **bound.kwargs)
        if not infers:
            raise SpecError(f"{self.op} returns nothing buildops can infer inside a pass: it has a lister, so its "
                            f"host code is not replayed, and its decorator has no output=. Pass output= to "
                            f"@{self.decorator} (an argument name, whose zeros it returns; a callable of its "
                            f"arguments that returns its placeholder; or None for an op that returns nothing)")
        return materialize(self._template(bound))

    def _template(self, bound: inspect.BoundArguments) -> Any:
        """The placeholder's template for this call, from a replay at the call's own shapes; kept per full
        signature (devices and strides too), since a pass calls an op with the same shapes again and again."""
        arguments = bound.arguments
        layout = tuple((name, value.device, value.stride()) for name, value in arguments.items()
                       if isinstance(value, torch.Tensor) and value.layout == torch.strided)
        try:
            key: Hashable = (call_signature(arguments, {}), layout)
            hash(key)
        except TypeError:  # nothing to key it by: replay every time
            key = None
        template = self._templates.get(key, _MISSING) if key is not None else _MISSING
        if template is not _MISSING:
            return template
        template = output_template(self.op, self.fn, bound)
        if key is not None:
            if len(self._templates) >= TEMPLATES_KEPT:
                self._templates.clear()
            self._templates[key] = template
        return template
