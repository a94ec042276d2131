"""How a Triton launch is named in builds, reports and late-compile records: its kernel, its specialization in
parameter order, and its options."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["compiled_label", "launch_label"]


def launch_label(name: str, params: Sequence[Any], specialization: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """A short name for one build that tells it from the kernel's other builds: the kernel, then its
    specialization in parameter order, then the launch's other options as passed, e.g.
    ``_matmul_kernel[fp16, M=1, N%16=0, K%16=0, BLOCK_M=16, warps=4, stages=4]``.

    Pointers: their dtype, once where all share it, and ``x_ptr unaligned`` where not 16-byte aligned. Ints: ``n=1``
    (compiled as a constant), ``n%16=0`` (a multiple of 16), nothing for another int32; other scalar types by name
    (``eps:fp32``, ``flag:u1``, ``n:i64``). Constexprs: ``NAME=value``. Options: ``num_`` left out of the name.
    """
    entries = [(param, entry) for param, entry in zip(params, specialization)
               if isinstance(entry, tuple) and len(entry) == 2]
    shared = _shared_dtype([ty for _, (ty, _) in entries if isinstance(ty, str)])
    parts = [shared] if shared else []
    for param, (ty, spec) in entries:
        name_ = param.name
        if ty == "constexpr":
            parts.append(_constant(name_, spec))
        elif isinstance(ty, str) and ty.startswith("*"):
            if shared is None:
                parts.append(f"{name_}:{ty[1:]}")
            if spec != "D" and not getattr(param, "do_not_specialize_on_alignment", False):
                parts.append(f"{name_} unaligned")
        elif ty == "i32":
            if spec == "D":
                parts.append(f"{name_}%16=0")
        else:
            parts.append(f"{name_}:{ty}{'%16=0' if spec == 'D' else ''}")
    names = {param.name for param in params}
    parts += _options({k: v for k, v in kwargs.items() if k not in names})
    return f"{name}[{', '.join(parts)}]" if parts else name


def compiled_label(name: str, arg_names: Sequence[str], signature: Mapping[str, Any] | None,
                   constants: Mapping[Any, Any] | None, options: Mapping[str, Any]) -> str:
    """The label of a compile Triton made on its own (what its post-compile hook is given), in the words of
    :func:`launch_label`: the pointers' dtype (once where all share it), other parameters' types, every constant
    by parameter name (``BLOCK_R=64``; ``n=1`` for an int compiled as one), then the options, e.g.
    ``_softmax_kernel[fp16, n_cols:i32, BLOCK=1024, warps=4, stages=3]``."""
    types = {arg: ty for arg, ty in (signature or {}).items() if ty != "constexpr" and isinstance(ty, str)}
    shared = _shared_dtype(list(types.values()))
    parts = [shared] if shared else []
    named = {}
    for path, value in (constants or {}).items():
        path = path if isinstance(path, tuple) else (path,)
        if path and isinstance(path[0], int) and path[0] < len(arg_names):
            named[arg_names[path[0]] + "".join(f"[{i}]" for i in path[1:])] = value
        else:
            named[str(path)] = value
    parts += [f"{arg}:{ty[1:] if ty.startswith('*') else ty}" for arg, ty in types.items()
              if arg not in named and not (shared and ty.startswith("*"))]
    parts += [_constant(arg, value) for arg, value in named.items()]
    parts += _options({k: v for k, v in options.items() if v is not None})
    return f"{name}[{', '.join(parts)}]"


def _shared_dtype(types: Sequence[str]) -> str | None:
    """The pointers' dtype where every pointer among ``types`` has the same, else None."""
    pointers = [ty for ty in types if ty.startswith("*")]
    return pointers[0][1:] if pointers and all(ty == pointers[0] for ty in pointers) else None


def _constant(name: str, value: Any) -> str:
    return f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"


def _options(options: Mapping[str, Any]) -> list[str]:
    return [f"{k.removeprefix('num_')}={v}" for k, v in options.items()]
