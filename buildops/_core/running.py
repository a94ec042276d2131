"""``@builds_by_running``: ops whose kernels compile inside their own run (DeepGEMM, JIT-on-first-call code).

Each build is one real run of the op at a swept shape, on the call's arguments cut or tiled to that shape (into
copies), on a builder thread, on that thread's own CUDA stream where the arguments are on a GPU.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping

import torch

from .._config import settings
from .._runtime.gpu import worker_stream
from .build import Build
from .declaring import Lister, Op, P, R, refuse_bare_use, refuse_unlistable, transparent, with_static, wrap
from .names import op_name
from .ops import OpCore
from .placeholders import Output
from .specs import BuildConfig, DynamicSpec, SpecError
from .tensor_specs import tensor_dims

__all__ = ["builds_by_running"]


class _RunningOp(OpCore):
    """An op whose kernels compile inside its own run: each build is one real run at a swept shape."""

    def register_lister(self, fn: Lister) -> Lister:
        raise TypeError(f"{self.name} is a @builds_by_running op: its builds are its own runs, so it takes no lister")

    def builds(self, bound: inspect.BoundArguments, dims: Mapping[str, int]) -> list[Build]:
        device = next((v.device for v in bound.arguments.values() if isinstance(v, torch.Tensor) and v.is_cuda),
                      None)
        key = ("run", self.name, self.config.signature(bound.arguments), tuple(sorted(dims.items())))
        run = functools.partial(_run_at, self.fn, bound, self.config.shapes(dims), device)
        # not shared across processes: the run compiles into this process, and its key names this process's objects
        return [Build(self.name, key, run, uses_gpu=device is not None, label=f"{self.name} {dict(dims)}",
                      shared=False)]


def _fit(tensor: torch.Tensor, dims: Mapping[int, int]) -> torch.Tensor:
    """A new tensor like ``tensor`` with the given dims cut (leading slice) or tiled (repeated) to size."""
    out = tensor
    for dim, size in dims.items():
        have = out.shape[dim]
        if size <= have:
            out = out.narrow(dim, 0, size)
        else:
            if have == 0:
                raise SpecError(f"cannot tile a tensor whose dim {dim} is 0 up to {size}")
            repeats = [1] * out.dim()
            repeats[dim] = -(-size // have)
            out = out.repeat(*repeats).narrow(dim, 0, size)
    # Always a copy: a build must never write into (or read while others write) the call's own tensors.
    return out.clone(memory_format=torch.contiguous_format) if tensor.is_contiguous() else out.clone()


def _fitted(bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]]) -> inspect.BoundArguments:
    """The call's arguments for one swept shape: swept tensors (and those ``dims=`` ties to them) cut or tiled into
    copies, swept ints replaced. Other tensors are passed as they are: they are mostly weights and KV caches, and
    a copy of each per run could take more memory than the GPU has."""
    call = inspect.BoundArguments(bound.signature, bound.arguments.copy())
    for name, fitted in shapes.items():
        call.arguments[name] = fitted[None] if None in fitted else _fit(call.arguments[name], tensor_dims(fitted))
    return call


def _run_at(fn: Callable, bound: inspect.BoundArguments, shapes: Mapping[str, Mapping[int | None, int]],
            device: torch.device | None) -> None:
    """One real run of ``fn`` at one swept shape; on a GPU, on this worker's stream, finished before returning."""
    if device is None:
        call = _fitted(bound, shapes)
        fn(*call.args, **call.kwargs)
        return
    stream = worker_stream(device)
    stream.wait_stream(torch.cuda.default_stream(device))  # the dummy inputs were written on the caller's side
    with torch.cuda.device(device), torch.cuda.stream(stream):
        call = _fitted(bound, shapes)
        fn(*call.args, **call.kwargs)
    stream.synchronize()


def builds_by_running(config: BuildConfig, *, dims: Mapping[str, int | tuple[int, str]] | None = None,
                      static: str | Iterable[str] = (), output: Output = None,
                      name: str | None = None) -> Callable[[Callable[P, R]], Op[P, R]]:
    """Decorate an op whose kernels compile inside its own run (DeepGEMM, JIT-on-first-call code).

    In a pass each new call signature queues one real run per swept shape, on the call's arguments cut or tiled
    to that shape, on a worker thread (on the worker's own CUDA stream when the arguments are on a GPU). The cut
    or tiled tensors are copies; other tensor arguments (weights, caches) reach the run as they are, so a tensor
    the op writes into belongs in ``dims`` unless the run may write into the caller's.

    Every argument not swept is part of the call signature, by value for scalars, so ``alpha=2.0`` and
    ``alpha=3.0`` would make two sets of runs: a run cannot tell what compiled from what merely ran. Name the
    arguments that do not change what compiles in ``static=``; the runs then take the first call's values.

    Args:
        config: the op's swept dims.
        dims: more tensors to cut or tile along with a swept dim: ``{"out": 0}`` (dim 0 of ``out`` follows the
            config's only swept spec) or ``{"out": (0, "x.0")}`` (follows the spec named ``"x.0"``).
        static: names of arguments left out of the call signature, e.g. ``static=("alpha",)``. Each must be a
            parameter of the op that is not swept (nor in ``dims``); decorating fails otherwise.
        output: as for :func:`lists_kernels`.
        name: as for :func:`lists_kernels`.
    """
    refuse_bare_use("builds_by_running", config)

    def decorate(fn: Callable[P, R]) -> Op[P, R]:
        refuse_unlistable("builds_by_running", fn)
        if not settings.enabled:
            return transparent(fn, name)
        op = op_name(fn, name)
        with_dims = with_static("builds_by_running", op, _with_dims(op, config, dims), static, "alpha")
        return wrap(fn, _RunningOp(fn, with_dims, output, name, "builds_by_running"))
    return decorate


def _with_dims(op: str, config: BuildConfig, dims: Mapping[str, int | tuple[int, str]] | None) -> BuildConfig:
    """``config`` with a spec per ``dims`` entry, each following a swept spec; errors name the op and the entry."""
    if not dims or not isinstance(config, BuildConfig):  # no BuildConfig: OpCore's own error says what to pass
        return config
    free = [s.key for s in config.specs if s.follows is None]
    example = f"e.g. dims={{'out': 0}} or dims={{'out': (0, {free[0]!r})}}"
    if not isinstance(dims, Mapping):
        raise TypeError(f"@builds_by_running on {op}: dims= maps argument names to a dim or (dim, spec name), "
                        f"{example}; got {dims!r}")
    extra = []
    for arg, where in dims.items():
        if isinstance(where, int) and not isinstance(where, bool):
            dim, follows = where, None
        elif (isinstance(where, tuple) and len(where) == 2 and isinstance(where[0], int)
              and not isinstance(where[0], bool) and isinstance(where[1], str)):
            dim, follows = where
        else:
            raise SpecError(f"@builds_by_running on {op}: dims[{arg!r}] = {where!r}; expected a dim (an int) or "
                            f"(dim, spec name), {example}")
        if follows is None and len(free) != 1:
            raise SpecError(f"@builds_by_running on {op}: dims={{{arg!r}: {dim}}}: the config sweeps {free}; "
                            f"say which one it follows: {{{arg!r}: ({dim}, {free[0]!r})}}")
        if follows is not None and follows not in free:
            raise SpecError(f"@builds_by_running on {op}: dims[{arg!r}] follows {follows!r}, which the config does "
                            f"not sweep; it sweeps {free}")
        extra.append(DynamicSpec(arg, dim, follows=follows or free[0]))
    return config.with_specs(*extra)
