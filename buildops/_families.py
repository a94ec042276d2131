"""Op families: builds that a model's configuration alone determines, queued as soon as the model exists.

Some kernels are known before any forward runs, even before the weights exist: the attention modules for the
model's head dim and dtype, the GEMM shapes of its layers, a sampling module. A family recognises the models it
knows and lists those builds; :func:`model_created` runs every registered family on a new model and queues what
they list, so those builds start first and overlap everything after them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ._builder import Build, default_builder
from ._passes import current_pass

__all__ = ["OpFamily", "model_created", "register_family", "unregister_family"]

logger = logging.getLogger("buildops")


@runtime_checkable
class OpFamily(Protocol):
    """Contract for a family:

    * ``name``: how reports and logs refer to it.
    * ``recognizes(model, config)``: cheap, side-effect free; True if this family has builds for this model.
    * ``builds(model, config)``: the builds the configuration determines. It must not need the weights' values
      (they may not be loaded yet), nor allocate GPU memory, nor compile anything itself.
    """

    name: str

    def recognizes(self, model: Any, config: Any) -> bool: ...

    def builds(self, model: Any, config: Any) -> Iterable[Build]: ...


_families: list[OpFamily] = []
_lock = threading.Lock()


def register_family(family: OpFamily) -> OpFamily:
    """Add a family (idempotent); returns it, so it can be used as a class decorator on an instance factory."""
    if not isinstance(family, OpFamily):
        raise TypeError(f"register_family: {family!r} is not an OpFamily (needs name, recognizes(), builds())")
    with _lock:
        if family not in _families:
            _families.append(family)
    return family


def unregister_family(family: OpFamily) -> None:
    with _lock:
        if family in _families:
            _families.remove(family)


def model_created(model: Any, config: Any = None) -> list[concurrent.futures.Future]:
    """Queue the builds of every registered family that recognises ``model``; returns their futures.

    Inside a pass the builds belong to it (a raising body cancels them, a ``build_pass`` joins them); outside one
    they go straight to the builder, to be joined with :func:`buildops.join`.
    """
    with _lock:
        families = list(_families)
    futures: list[concurrent.futures.Future] = []
    build_pass = current_pass()
    for family in families:
        if not family.recognizes(model, config):
            continue
        builds = list(family.builds(model, config))
        logger.info("buildops: family %s queues %d build(s) for %s", family.name, len(builds), type(model).__name__)
        if build_pass is not None:
            futures += build_pass.take(family.name, ("model_created", id(model)), {}, builds)
        else:
            builder = default_builder()
            futures += [builder.submit(build) for build in builds]
    return futures
