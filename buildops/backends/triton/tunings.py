"""A tuner's choices: its key, the choice for a key (in its memory, else kept beside Triton's cache), and the
choice for the nearest key.

* **Kept choices.** Every tuning a build makes is written beside Triton's cache
  (``<TRITON_CACHE_DIR>/buildops-tunings/``), named by the kernel's source hash, the tuner's key and the target.
  Wherever a tuner meets a key that has no choice in memory (a tune build, a replay, a serving launch), it takes a
  kept one without timing anything: a restart, or another process of the node sharing the cache, runs the same
  config without tuning again. A kept file that cannot be read, or names a config the tuner no longer has, is a miss.
* **Shared.** A tune build carries its kept choice as its artifact (:class:`KeptChoice`): the processes of a node
  claim it as one build (one tunes; the others then take its choice, untimed), and a build store
  (``BUILDOPS_STORE``) carries it to other nodes, so every rank of a job runs the same config.
* **Nearest.** What runs at a key no one tuned yet: the choice for the nearest key of the same kernel (as vLLM's
  fused-MoE config lookup takes the nearest M), else the first config.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from triton import knobs
from triton.runtime.autotuner import Autotuner

from ..._runtime.files import write_atomically
from .driver import inner_jit, kernel_name, target
from .versions import tuning_choices

__all__ = ["KeptChoice", "keep", "kept", "known", "nearest", "stand_in_config"]

logger = logging.getLogger("buildops")

_DIRECTORY = "buildops-tunings"


def _path(tuner: Autotuner, key: tuple) -> Path:
    jit = inner_jit(tuner)
    the_target = target()
    name = repr((kernel_name(jit), jit.cache_key, key, the_target.backend, the_target.arch))
    return Path(knobs.cache.dir) / _DIRECTORY / f"{hashlib.sha256(name.encode()).hexdigest()}.json"


def _described(config: Any) -> dict[str, Any]:
    return {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages,
            "num_ctas": config.num_ctas, "maxnreg": config.maxnreg}


class KeptChoice:
    """A tune build's artifact for the build store (the ``Artifact`` contract): its kept choice, one small file.

    Its identity names the kernel's source, the tuning key, the target, the GPU's model (timings differ between
    models of one architecture) and Triton's version; nothing of where things are installed.

    Args:
        tuner: the tuner.
        key: the tuning key.
        device: the GPU the tuning times on.
    """

    def __init__(self, tuner: Autotuner, key: tuple, device: Any) -> None:
        self.path = _path(tuner, key)
        self.device = device
        self._identity: str | None = None

    def identity(self) -> str:
        if self._identity is None:
            import torch
            import triton

            named = repr(("triton-tuning", self.path.name, torch.cuda.get_device_name(self.device),
                          triton.__version__))
            self._identity = hashlib.sha256(named.encode()).hexdigest()
        return self._identity

    def known_locally(self) -> bool:
        return self.path.is_file()

    def install(self, files: Mapping[str, bytes]) -> None:
        data = files.get(self.path.name)
        if data is not None and not self.path.exists():  # an entry already here is never replaced
            write_atomically(self.path, data)

    def collect(self) -> dict[str, bytes] | None:
        try:
            return {self.path.name: self.path.read_bytes()}
        except OSError:  # nothing kept (the tuning failed to write it): nothing to share
            return None


def keep(tuner: Autotuner, key: tuple, config: Any) -> None:
    """Keep the config a tuning chose for ``key``, beside Triton's cache. A failure to write is only logged."""
    try:
        write_atomically(_path(tuner, key), json.dumps({"kernel": kernel_name(inner_jit(tuner)), "key": repr(key),
                                                        "config": _described(config)}))
    except Exception:
        logger.debug("buildops: keeping the tuning of %s at %r failed", tuner.base_fn.__name__, key, exc_info=True)


def kept(tuner: Autotuner, key: tuple) -> Any:
    """The tuner's config kept for ``key``, or None (none kept, unreadable, or no longer among its configs)."""
    try:
        path = _path(tuner, key)
        if not path.is_file():
            return None
        described = json.loads(path.read_text(encoding="utf-8"))["config"]
    except Exception:
        logger.debug("buildops: the kept tuning of %s at %r cannot be read", tuner.base_fn.__name__, key,
                     exc_info=True)
        return None
    return next((config for config in tuner.configs if _described(config) == described), None)


def known(tuner: Autotuner, key: tuple) -> Any:
    """The tuner's choice for ``key``: in its memory, else kept (then put in its memory, as Triton's own disk
    cache does), else None."""
    choices = tuning_choices(tuner)
    if choices is None:
        return None
    config = choices.get(key)
    if config is None:
        config = kept(tuner, key)
        if config is not None:
            choices[key] = config
    return config


def nearest(choices: Any, key: tuple) -> Any:
    """The choice filed under the key nearest ``key``: one of the same length, equal but for its numbers (dtypes
    and other values alike), at the least summed distance of its numbers; the smaller key on a tie. None if none."""
    def numeric(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    best, best_distance = None, None
    for other in list(choices):
        if not isinstance(other, tuple) or len(other) != len(key):
            continue
        if any(numeric(a) != numeric(b) or (not numeric(a) and a != b) for a, b in zip(key, other)):
            continue
        distance = sum(abs(a - b) for a, b in zip(key, other) if numeric(a))
        if best_distance is None or (distance, other) < (best_distance, best):
            best, best_distance = other, distance
    return None if best is None else choices[best]


def stand_in_config(tuner: Autotuner, key: tuple, configs: list) -> Any:
    """What a launch at an untuned ``key`` runs with instead of tuning: the choice for the nearest key, else the
    first of ``configs``."""
    choices = tuning_choices(tuner)
    chosen = nearest(choices, key) if choices else None
    return chosen if chosen is not None and chosen in configs else configs[0]
