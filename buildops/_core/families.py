"""Op families: builds that a model's configuration alone determines, queued before any forward runs.

Some kernels are known before any forward runs, even before the weights exist: the attention modules for the
model's head dim and dtype, the GEMM shapes of its layers, a sampling module. A family recognises the models it
knows and lists those builds. :func:`model_configured` runs every registered family on a configuration, before the
engine allocates its model (and often before the device's context exists); :func:`model_created` runs them on the
new model. Either queues what they list, so those builds start first and overlap everything after them.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .build import Build
from .default import default_builder
from .passes import current_pass
from .state import core

__all__ = ["OpFamily", "model_configured", "model_created", "register_family", "unregister_family"]

logger = logging.getLogger("buildops")


@runtime_checkable
class OpFamily(Protocol):
    """Contract for a family:

    * ``name``: how reports and logs refer to it.
    * ``recognizes(model, config)``: cheap, side-effect free; True if this family has builds for this model.
      ``model`` is None when the engine calls :func:`model_configured`, before the model exists: a family that
      can list from ``config`` alone should say True then, and one that needs the model's modules False.
    * ``builds(model, config)``: the builds the configuration determines. It must not need the weights' values
      (they may not be loaded yet), nor allocate GPU memory, nor compile anything itself.
    """

    name: str

    def recognizes(self, model: Any, config: Any) -> bool: ...

    def builds(self, model: Any, config: Any) -> Iterable[Build]: ...


def register_family(family: OpFamily) -> OpFamily:
    """Add a family (idempotent); returns it, so it can be used as a class decorator on an instance factory."""
    if not isinstance(family, OpFamily):
        raise TypeError(f"register_family: {family!r} is not an OpFamily (needs name, recognizes(), builds())")
    with core.families_lock:
        if family not in core.families:
            core.families.append(family)
    return family


def unregister_family(family: OpFamily) -> None:
    """Remove a family registered with :func:`register_family` (nothing if it is not registered)."""
    with core.families_lock:
        if family in core.families:
            core.families.remove(family)


def model_configured(config: Any) -> list[concurrent.futures.Future]:
    """Queue the builds of every registered family that lists them from ``config`` alone (asked with ``model=None``);
    returns their futures. Call it before allocating the model, once the engine has selected this process's
    device (``torch.cuda.set_device``): builds take their target and device from the current one. The allocation
    and the device's context then overlap those builds. A later :func:`model_created` finds them queued (one
    build per key) and adds only what needs the model.

    Raises TypeError, naming the family, if one fails when asked with ``model=None``: it needs the model, so its
    ``recognizes`` should return False then.
    """
    return _queue_family_builds(None, config)


def model_created(model: Any, config: Any = None) -> list[concurrent.futures.Future]:
    """Queue the builds of every registered family that recognises ``model``; returns their futures.

    Inside a pass the builds belong to it (a raising body cancels them, a ``build_pass`` joins them); outside one
    they go straight to the builder, to be joined with :func:`buildops.join`.
    """
    return _queue_family_builds(model, config)


def _queue_family_builds(model: Any, config: Any) -> list[concurrent.futures.Future]:
    with core.families_lock:
        families = list(core.families)
    futures: list[concurrent.futures.Future] = []
    build_pass = current_pass()
    subject = type(model).__name__ if model is not None else f"the configuration {type(config).__name__}"
    for family in families:
        try:
            if not family.recognizes(model, config):
                continue
            builds = list(family.builds(model, config))
        except Exception as error:
            if model is not None:
                raise
            # A family that needs the model fails here, where it is first asked, not in a start's later steps.
            raise TypeError(f"buildops: family {family.name!r} failed when asked to list from the configuration "
                            f"alone (model=None, from model_configured): {error!r}. If it needs the model's "
                            "modules, have its recognizes() return False when model is None; model_created will "
                            "ask it again with the model.") from error
        logger.info("buildops: family %s queues %d build(s) for %s", family.name, len(builds), subject)
        if build_pass is not None:
            futures += build_pass.take(family.name, _signature(model, config), {}, builds)
        else:
            builder = default_builder()
            futures += [builder.submit(build) for build in builds]
    return futures


def _signature(model: Any, config: Any) -> tuple:
    """What a pass's listing records name this call by (``buildops.testing.record_listings``)."""
    if model is not None:
        return ("model_created", id(model))
    try:
        hash(config)
    except TypeError:  # e.g. a dict: its id, which another config may reuse once this one is gone
        return ("model_configured", id(config))
    return ("model_configured", config)
