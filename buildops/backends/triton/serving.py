"""Autotuned launches after a pass: none tunes on a serving thread.

After the first pass, an autotuned launch outside the builds whose key was never tuned (:func:`.tunings.known`)
does not tune on the calling thread (``BUILDOPS_SERVING_TUNE=defer``): it runs at once with the config tuned for
the nearest key of the same kernel, or the first config where none is (:func:`.tunings.stand_in_config`), and moves
its own key's tuning ahead on the builder's serial worker (queueing it where no pass listed it); from then on the
key's launches use what that tuning chose. A key no pass listed is a gap in coverage, recorded once as a late tuning
(``BUILDOPS_LATE_COMPILE`` says whether it warns or raises). ``inline`` keeps Triton's behaviour, and so does
``BUILDOPS_AUTOTUNE=0`` (tunings are then never built: launches tune at first use).
"""

from __future__ import annotations

import logging
from typing import Any

from triton.runtime.autotuner import Autotuner

from ..._config import read_or_default, settings
from ..._core.builder_threads import on_builder_thread
from ..._core.default import default_builder
from ..._core.late import LateCompile, armed, caller, record
from .autotune import tune_build
from .driver import inner_jit, kernel_name
from .late import listed_by
from .state import triton_state
from .tunings import known, stand_in_config
from .versions import tuning_key

__all__ = ["serve"]

logger = logging.getLogger("buildops")


def serve(tuner: Autotuner, original: Any, args: tuple, kwargs: dict) -> Any:
    """``Autotuner.run`` outside a recording (see the module's docstring); ``original`` is Triton's own."""
    if not armed() or len(tuner.configs) <= 1 or on_builder_thread():
        return original(tuner, *args, **kwargs)
    key: tuple = ()
    try:
        key = tuning_key(tuner, args, kwargs)
        tuned = (known(tuner, key) is not None or read_or_default(type(settings).serving_tune) == "inline"
                 or not read_or_default(type(settings).autotune))  # tunings not built: they tune at first use
    except Exception:
        logger.debug("buildops: %s: its tuning key could not be read", tuner.base_fn.__name__, exc_info=True)
        tuned = True
    if tuned:
        return original(tuner, *args, **kwargs)
    configs = list(tuner.configs)
    config = stand_in_config(tuner, key, configs)
    _queue_tuning(tuner, key, args, kwargs, original, config)
    tuner.best_config = config
    if config.pre_hook is not None:
        config.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()})
    return tuner.fn.run(*args, **kwargs, **config.all_kwargs())


def _queue_tuning(tuner: Autotuner, key: tuple, args: tuple, kwargs: dict, original: Any, config: Any) -> None:
    """Queue the tuning of ``key`` (or move it ahead, where a pass queued it), and record it as a late tuning."""
    name = kernel_name(inner_jit(tuner))
    ops = listed_by(name)
    with triton_state.tunings_queued_lock:
        first = (name, key) not in triton_state.tunings_queued
        triton_state.tunings_queued.add((name, key))
    if not first:  # queued, and recorded, by an earlier launch at this key
        return
    listed = False
    try:
        build = tune_build(ops[0] if ops else tuner.base_fn.__name__, tuner, args, kwargs, [], original)
        if build is not None:
            builder = default_builder()
            listed = builder.future(build.key) is not None  # a pass queued it: pending, not a gap in coverage
            builder.expedite([builder.submit(build)])
    except Exception:  # a tuning not queued leaves the stand-in config in use, nothing worse
        logger.warning("buildops: queueing the tuning of %s at %r failed", name, key, exc_info=True)
    if not listed:
        record(LateCompile("triton", name, f"autotuning key {key!r}: ran with {config} meanwhile", ops, caller(),
                           kind="tuning"), ("triton-autotune", name, key))
