"""Recording Triton launches as builds, with the launch's exact specialization.

A build is recorded where the real launch would happen, at the innermost ``JITFunction.run``, with the arguments
and keyword options the launch passes (after ``@triton.autotune`` and ``@triton.heuristics`` have added theirs,
in the same order, since Triton's in-memory key depends on it). Every tensor becomes a stand-in with the tensor's
dtype and pointer alignment, so integers equal to 1, multiples of 16 and aligned pointers specialize as they
would, and the real launch later finds the kernel in Triton's cache.

A build's label names the kernel and its specialization as Triton's binder computed it (pointer dtypes and
alignment, which ints are 1 or multiples of 16, scalar types, constexprs) and the launch's options, so that two
builds of one kernel never share a label.

A recorded launch returns what the real one would, for code that keeps it: ``JITFunction.run`` a
:class:`~.pending.PendingKernel` (the compiled kernel, once resolved after the pass), and ``Autotuner.run`` the
pending kernel of the config it sets as the tuner's ``best_config`` (:func:`~.autotune.config_for_replay`).

``JITFunction.run`` and ``Autotuner.run`` (and, with ``TRITON_INTERPRET=1``, ``InterpretedFunction.run``) are
patched only while a recording is active, and even then they record only in the context (thread) that records:
elsewhere Triton runs as without buildops.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from ..._core.build import Build
from ..._core.early_starts import recorded
from ..._runtime.patching import Patch
from .autotune import config_for_replay, tune_build
from .build import WarmupRun
from .driver import active_driver, compile_only, kernel_name, target
from .entries import TritonEntries
from .interpret import InterpretedRun, interpreted, run_patch, twin
from .labels import launch_label
from .late import note_listed
from .patches import building
from .pending import PendingKernel
from .serving import serve
from .stand_ins import stand_in
from .state import triton_state
from .versions import launch_key, launch_specialization

__all__ = ["recording", "serve_after_passes", "triton_builds"]

logger = logging.getLogger("buildops")


def _launch_key(jit: JITFunction, args: tuple, kwargs: dict) -> str:
    """The key ``JITFunction.run`` will look up for this launch (:mod:`.versions`)."""
    return launch_key(*launch_specialization(jit, active_driver().get_current_device(), args, kwargs))


class _Recording:
    def __init__(self, op: str) -> None:
        self.op = op
        self.builds: list[Build] = []

    def add(self, jit: Any, args: tuple, kwargs: dict) -> PendingKernel | None:
        """Record one launch as a build; return what stands for its compiled kernel (None for an interpreted
        one, whose ``run`` returns nothing either)."""
        stand_ins = tuple(stand_in(a) for a in args)
        kwargs = {k: stand_in(v) for k, v in kwargs.items()}
        the_target = target()
        # An interpreted kernel specializes through its twin: a JITFunction over the same function, never compiled
        binder = twin(jit) if interpreted(jit) else jit
        specialization, options = launch_specialization(binder, active_driver().get_current_device(), stand_ins,
                                                        kwargs)
        label = launch_label(jit.fn.__name__, binder.params, specialization, kwargs)
        note_listed(kernel_name(binder), self.op)
        launch = launch_key(specialization, options)
        if binder is not jit:
            key = ("triton-interpreter", kernel_name(binder), binder.cache_key, launch, the_target)
            self.builds.append(Build(self.op, key, InterpretedRun(), label=label, library="triton", shared=False))
            return None
        key = ("triton", kernel_name(jit), jit.cache_key, launch, the_target)
        device = active_driver().get_current_device()
        # On a GPU the build also loads the module: GPU work, which graph capture must not overlap.
        run = WarmupRun(jit, stand_ins, kwargs, device, the_target)
        entries = TritonEntries(key, (the_target.backend, the_target.arch, the_target.warp_size), run)
        build = Build(self.op, key, run, uses_gpu=not compile_only(), loads_only=True, label=label,
                      library="triton", artifact=entries, abandon=run.abandon)
        self.builds.append(build)
        recorded(build)
        return PendingKernel(build, jit, stand_ins, kwargs, device)


def _recording_jit_run(original: Any) -> Any:
    """The replacement of ``JITFunction.run`` (and ``InterpretedFunction.run``, whose signature is the same)."""
    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        recording = triton_state.recording.get()
        if not isinstance(recording, _Recording):
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return recording.add(self, args, kwargs)
    return run


def _recording_autotuner_run(original: Any, serves: bool = True) -> Any:
    """The replacement of ``Autotuner.run`` (and of a library's tuner class that overrides it): recorded in a
    recording; elsewhere, for Triton's own, as :func:`.serving.serve` says (after the first pass: no tuning on the
    calling thread at a key no build tuned), and for another class, its own ``run``."""
    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        recording = triton_state.recording.get()
        if not isinstance(recording, _Recording):
            return serve(self, original, args, kwargs) if serves else original(self, *args, **kwargs)
        first = len(recording.builds)
        configs = _configs_to_build(self, args, kwargs)
        # every config, no benchmark: each is a build
        launched = [self.fn.run(*args, **kwargs, **config.all_kwargs()) for config in configs]
        if not interpreted(self):  # the interpreter times nothing ahead: it runs each launch in Python
            tune = tune_build(recording.op, self, args, kwargs, [b.key for b in recording.builds[first:]], original)
            if tune is not None:
                recording.builds.append(tune)
        if not configs:
            return None
        # What a real run leaves for code that reads it back: the config it launched, and that config's kernel
        chosen = config_for_replay(self, args, kwargs, configs)
        self.best_config = configs[chosen]
        return launched[chosen]
    return run


_JIT_RUN = Patch(JITFunction, "run", _recording_jit_run,
                 "Triton 3.6-3.7 have no hook before a launch compiles: launches are recorded where "
                 "they would compile")
_AUTOTUNER_RUN = Patch(Autotuner, "run", _recording_autotuner_run,
                       "Triton 3.6-3.7's Autotuner benchmarks every config at its first launch: it is recorded "
                       "as one build per config instead, and after a pass never tunes on a serving thread")


def _tuner_class_patches_now() -> list[Patch]:
    """A patch of ``run`` for each subclass of ``Autotuner`` that overrides it (a library's own tuner, which would
    otherwise time stand-ins in a replay and keep what it timed), made once per class."""
    found, classes = [], list(Autotuner.__subclasses__())
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        if "run" in cls.__dict__:
            patch = triton_state.tuner_class_patches.get(cls)
            if patch is None:
                patch = triton_state.tuner_class_patches[cls] = Patch(
                    cls, "run", lambda original: _recording_autotuner_run(original, serves=False),
                    "a library's Autotuner subclass times its configs at its first launch: recorded as Triton's is")
            found.append(patch)
    return found


def serve_after_passes() -> None:
    """Hold the patch of ``Autotuner.run`` beyond recordings, so that launches after a pass follow
    :func:`.serving.serve` (a late-compile watcher: installed when the first outermost pass ends, until
    ``buildops.testing.reset``). One patch serves both: two of one attribute could only be released in the order
    they were installed."""
    with triton_state.serving_lock:
        if triton_state.serving_patch is not None:
            return
        triton_state.serving_patch = _AUTOTUNER_RUN  # released by triton_state.reset()
    _AUTOTUNER_RUN.acquire()


def _configs_to_build(tuner: Autotuner, args: tuple, kwargs: dict) -> list:
    """The tuner's configs after its own early pruning (data-independent by contract), without its perf model."""
    if len(tuner.configs) <= 1 or not tuner.early_config_prune:
        return list(tuner.configs)
    try:
        return list(tuner.early_config_prune(tuner.configs, dict(zip(tuner.arg_names, args)), **kwargs))
    except Exception:  # pruning that needs real data: build every config, which is never wrong, only more
        logger.debug("buildops: early_config_prune of %s failed on stand-ins; building every config",
                     tuner.base_fn.__name__, exc_info=True)
        return list(tuner.configs)


@contextlib.contextmanager
def recording(op: str) -> Iterator[list[Build]]:
    """Within the block, Triton launches on this thread become builds (appended to the yielded list) instead of
    compiles and launches. Other threads launch as usual.

    Args:
        op: the op the builds are reported under.
    """
    target()  # make sure a driver exists, so the binder can specialize
    recording_ = _Recording(op)
    with contextlib.ExitStack() as patches:
        patches.enter_context(building())  # a listing parses kernels (their cache keys) beside the builds
        for patch in (_JIT_RUN, _AUTOTUNER_RUN, run_patch(_recording_jit_run), *_tuner_class_patches_now()):
            if patch is not None:
                patches.enter_context(patch.applied())
        token = triton_state.recording.set(recording_)
        try:
            yield recording_.builds
        finally:
            triton_state.recording.reset(token)


def triton_builds(op: str, kernel: Any, *args: Any, **kwargs: Any) -> list[Build]:
    """The builds a launch ``kernel[grid](*args, **kwargs)`` needs, without compiling or launching anything.

    ``kernel`` is a ``@triton.jit`` function, possibly under ``@triton.autotune`` (one build per config left after
    the tuner's early pruning) and ``@triton.heuristics`` (applied as at launch). Tensor arguments may be real or
    fake tensors, :class:`~buildops.TensorSpec`, or torch dtypes. Pass the keyword options (``num_warps``, ...)
    exactly as the real launch does, in the same order: Triton's cache key depends on them.

    Args:
        op: the op the builds are reported under.
        kernel: the kernel, as the launch names it.
        *args: the launch's arguments.
        **kwargs: the launch's keyword arguments and options.
    """
    with recording(op) as builds:
        kernel.run(*args, grid=(1,), warmup=False, **kwargs)
    return builds
