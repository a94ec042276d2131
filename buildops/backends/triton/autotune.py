"""Autotuning in the build, on a GPU: the tuner's own ``run`` on zero-filled operands of the launch's shapes.

Its in-memory cache then holds a choice for the launch's key and the first real call times nothing; the choice is
also kept beside Triton's cache (:mod:`.tunings`), so a restart or another process of the node tunes nothing.
Timings on zeros are what they are for GEMM-like kernels; a kernel whose speed depends on its data should not be
tuned this way (``BUILDOPS_AUTOTUNE=0``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

import torch
from triton.runtime.autotuner import Autotuner

from ..._config import settings
from ..._core.build import Build, Outcome
from ..._core.default import current_builder
from ..._core.readiness import ready_time
from ..._core.tensor_specs import TensorSpec
from ..._runtime.gaps import wait_for_gap
from ..._runtime.gpu import run_admitted
from ..._runtime.turns import is_urgent
from .driver import active_driver, compile_only, inner_jit, kernel_name, target
from .patches import building
from .stand_ins import PointerArg
from .tunings import KeptChoice, keep, known, stand_in_config
from .versions import tuning_choices, tuning_key

__all__ = ["COMPILE_WAIT_SECONDS", "config_for_replay", "tune_build"]

logger = logging.getLogger("buildops")

# The builder's serial worker already waited for the tune's compiles (``Build.after``): the run only waits for
# futures that are still being given their result.
COMPILE_WAIT_SECONDS = 1.0


class _Layout:
    """What it takes to allocate a stand-in for a tensor argument: shape, strides, offset, storage size, dtype."""

    __slots__ = ("shape", "stride", "offset", "storage", "dtype")

    def __init__(self, tensor: Any) -> None:
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype
        if isinstance(tensor, TensorSpec):
            self.stride, self.offset, self.storage = tensor.stride(), 0, tensor.numel()
        else:
            self.stride, self.offset = tuple(tensor.stride()), tensor.storage_offset()
            self.storage = tensor.untyped_storage().nbytes() // tensor.element_size()

    @property
    def nbytes(self) -> int:
        return self.storage * self.dtype.itemsize

    def zeros(self, device: torch.device) -> torch.Tensor:
        storage = torch.zeros(self.storage, dtype=self.dtype, device=device)
        return storage.as_strided(self.shape, self.stride, self.offset)


def config_for_replay(tuner: Autotuner, args: tuple, kwargs: dict, configs: list) -> int:
    """Which of ``configs`` (those a replay built) a replayed launch of ``tuner`` sets as its ``best_config`` and
    returns the kernel of, for a library that reads them back: the tuner's own choice for the launch's key where it
    has one (tuned by a build or a real run, or kept from an earlier one), else its choice for the nearest key, else
    the first config. A replay never tunes; a library that keeps what it read back keeps that config."""
    if len(configs) <= 1:
        return 0
    try:
        key = tuning_key(tuner, args, kwargs)
        chosen = known(tuner, key)
        if chosen is None:
            chosen = stand_in_config(tuner, key, configs)
    except Exception:
        logger.debug("buildops: the replay of %s could not look up its tuned configs", tuner.base_fn.__name__,
                     exc_info=True)
        return 0
    return next((i for i, config in enumerate(configs) if config == chosen), 0)


def tune_build(op: str, tuner: Autotuner, args: tuple, kwargs: dict, compiles: list, run: Any) -> Build | None:
    """The build that runs this launch's autotuning with ``run`` (``Autotuner.run`` itself), or None where it
    cannot run here or need not: no GPU, one config, ``BUILDOPS_AUTOTUNE=0``, a tensor argument known only by its
    dtype, or a choice for the launch's key already known (:func:`.tunings.known`)."""
    if len(tuner.configs) <= 1 or compile_only() or not settings.autotune:
        return None
    if any(isinstance(a, (torch.dtype, PointerArg)) for a in (*args, *kwargs.values())):
        return None
    key = tuning_key(tuner, args, kwargs)
    if known(tuner, key) is not None:
        return None

    def layout(value: Any) -> Any:
        return _Layout(value) if isinstance(value, (torch.Tensor, TensorSpec)) else value

    layouts = tuple(map(layout, args))
    kwargs = {name: layout(value) for name, value in kwargs.items()}
    jit = inner_jit(tuner)
    device = torch.device("cuda", active_driver().get_current_device())
    return Build(op, ("triton-autotune", kernel_name(jit), jit.cache_key, key, target()),
                 _TuneRun(tuner, key, layouts, kwargs, compiles, device, run), uses_gpu=True,
                 label=f"autotune {jit.fn.__name__}{list(key)}", serial=True, after=tuple(compiles),
                 artifact=KeptChoice(tuner, key, device))


class _TuneRun:
    """The run of a tune build. It runs on the builder's serial worker (``serial=True``), one tune at a time since
    tunes running together would time each other, once its configs' compiles are done (``after``); a compile not
    done in time is left to the tuner, which compiles what it lacks."""

    def __init__(self, tuner: Autotuner, key: tuple, layouts: tuple, kwargs: dict, compiles: list,
                 device: torch.device, run: Any) -> None:
        self.tuner, self.key, self.layouts, self.kwargs, self.compiles = tuner, key, layouts, kwargs, compiles
        self.device, self.run = device, run

    def __call__(self) -> Outcome:
        chosen_before = known(self.tuner, self.key)  # kept by an earlier process since this build was listed
        if chosen_before is not None:
            return Outcome(chosen_before, cached=True)
        builder = current_builder()  # None when a test runs the build by hand: nothing to wait for
        futures = (builder.future(k) for k in self.compiles) if builder is not None else ()
        compiles = [f for f in futures if f is not None]
        waiting = time.perf_counter()
        concurrent.futures.wait(compiles, timeout=COMPILE_WAIT_SECONDS)
        if ready_time() is not None:  # behind serving: in a gap of the GPU's work (not one a caller waits for)
            wait_for_gap(self.device, skip=is_urgent)
        waited = time.perf_counter() - waiting  # of the build's seconds, those spent on others' compiles or a gap
        tensors = [a for a in (*self.layouts, *self.kwargs.values()) if isinstance(a, _Layout)]

        def real(value: Any) -> Any:
            return value.zeros(self.device) if isinstance(value, _Layout) else value

        def make() -> tuple:
            return tuple(map(real, self.layouts)), {name: real(value) for name, value in self.kwargs.items()}

        chosen = []

        def tune(operands: tuple) -> None:
            args, kwargs = operands
            self.run(self.tuner, *args, **kwargs)
            chosen.append(self.tuner.best_config)

        with building():
            run_admitted(self.device, sum(t.nbytes for t in tensors), make, tune,
                         f"autotuning of {self.tuner.base_fn.__name__}")
        choice = (tuning_choices(self.tuner) or {}).get(self.key, chosen[0])
        keep(self.tuner, self.key, choice)
        return Outcome(choice, cached=False, waited=waited)
