"""Op names: each op's name is claimed for the process's life, so two ops never merge in reports, recordings or
``join(op=...)``, and a name never depends on when another op was collected."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from .state import core

__all__ = ["claim_name", "described", "hold_name", "op_name", "release_name", "short_name"]


def short_name(fn: Callable) -> str:
    # "make.<locals>.rmsnorm" reads as "rmsnorm"; "Attention.forward" stays as it is
    return getattr(fn, "__qualname__", repr(fn)).rpartition("<locals>.")[2]


def op_name(fn: Callable, name: str | None) -> str:
    """The op's name as its errors at decoration give it: ``name=``, else the function's short qualified name."""
    return name or short_name(described(fn))


def described(fn: Callable) -> Callable:
    """The function whose signature and name describe ``fn``: a torch custom op's own implementation for the
    ``CustomOpDef`` that ``torch.library.custom_op`` returns (whose ``__call__`` takes ``*args, **kwargs``)."""
    init = getattr(fn, "_init_fn", None)
    if init is not None and type(fn).__name__ == "CustomOpDef":
        return init
    return fn


def claim_name(fn: Callable, name: str | None, decorator: str) -> tuple[str, bool]:
    """The op's name, claimed for the process's life, and whether this call claimed it first: ``name=`` as given
    (another function's op with that name is an error naming both), else the short qualified name, qualified by
    module where another function's op holds it. A claim never lapses, so a name does not depend on when another
    op was collected (only ``buildops.testing.reset()`` frees the names of collected ops); decorating the same
    function again (a reload, a factory called twice) keeps its name."""
    function = described(fn)
    module = getattr(function, "__module__", None) or "?"
    qualname = getattr(function, "__qualname__", None) or repr(function)
    identity = (module, qualname)
    with core.names_lock:
        if name is not None:
            holder = core.names.get(name, identity)
            if holder != identity:
                raise ValueError(f"@{decorator}(name={name!r}) on {module}.{qualname}: {name!r} is already the name "
                                 f"of the op of {'.'.join(holder)}; two ops never share a name (their reports and "
                                 f"join(op=...) would merge): give one of them another name=")
            chosen = name
        else:
            short = short_name(function)
            candidates = (short, f"{module}.{short}", f"{module}.{qualname}")
            chosen = next((c for c in candidates if core.names.get(c, identity) == identity), None)
            if chosen is None:  # only where name= gave another op this module and qualname
                raise ValueError(f"@{decorator} on {module}.{qualname}: other ops hold each of its names "
                                 f"{list(candidates)}; give it one with name=")
        first = chosen not in core.names
        core.names[chosen] = identity
    return chosen, first


def release_name(name: str) -> None:
    """Give up a name first claimed by an op that was never made (its decoration failed)."""
    with core.names_lock:
        core.names.pop(name, None)
        core.name_holders.pop(name, None)


def hold_name(name: str, wrapper: Any) -> None:
    with core.names_lock:
        core.name_holders.setdefault(name, []).append(weakref.ref(wrapper))
