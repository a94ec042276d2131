"""Variant replay: record which compiled variants an op's plan asks a library for, and build them on workers.

Some ops pick a compiled variant through a lookup: an attention wrapper's ``plan()`` asks FlashInfer for the module
of its head dim, dtypes and mask; a kernel table is keyed by config. Run the plan inside :func:`variants` with the
lookups named, and each lookup call on this thread is recorded as a build that calls the *real* lookup on a worker
(which compiles the variant, and leaves it in the library's own cache for the real plan to find).

The recorded call never returns: it raises :class:`VariantRecorded`, which ends the plan and is swallowed at the
end of the block. So nothing stands in for a real module, and a cache around the lookup (FlashInfer's getters are
``functools.cache``) can never keep a fake: the cached wrapper itself is not touched, only the name the plan looks
up, and only for the recording thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._builder import Build

__all__ = ["VariantRecorded", "variants"]


class VariantRecorded(Exception):
    """Raised by a recorded lookup to end the plan that called it (caught by :func:`variants`)."""


_recording: contextvars.ContextVar[tuple[str, list[Build]] | None] = contextvars.ContextVar(
    "buildops_variants", default=None)
_lock = threading.Lock()
_installed: dict[str, tuple[Any, str, Callable, int]] = {}  # lookup -> (owner, attribute, original, users)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _recorder(lookup: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def lookup_or_record(*args: Any, **kwargs: Any) -> Any:
        recording = _recording.get()
        if recording is None:  # another thread, or outside the block: the real lookup
            return original(*args, **kwargs)
        op, builds = recording
        key = ("variant", lookup, tuple(map(_hashable, args)), tuple(sorted((k, _hashable(v))
                                                                           for k, v in kwargs.items())))
        builds.append(Build(op, key, functools.partial(original, *args, **kwargs),
                            label=f"{lookup.rpartition('.')[2]}{args}", library=lookup.split(".")[0]))
        raise VariantRecorded(lookup)
    return lookup_or_record


def _resolve(lookup: str) -> tuple[Any, str]:
    module_name, _, attribute = lookup.rpartition(".")
    if not module_name:
        raise ValueError(f"variants: {lookup!r} is not a dotted path like 'flashinfer.decode.get_batch_decode_module'")
    owner = importlib.import_module(module_name)
    if not hasattr(owner, attribute):
        raise ValueError(f"variants: module {module_name} has no {attribute!r}")
    return owner, attribute


@contextlib.contextmanager
def variants(op: str, *lookups: str) -> Iterator[list[Build]]:
    """Record the calls this thread makes to the named lookups (dotted paths) as builds, appended to the yielded
    list. The first recorded call ends the block's plan (raising :class:`VariantRecorded`, swallowed here): one
    plan call, one variant. Queue the builds with a pass's ops or ``builder.submit``."""
    with _lock:
        # every one resolved before any is installed: a bad one leaves nothing patched
        resolved = {lookup: _resolve(lookup) for lookup in lookups if lookup not in _installed}
        for lookup in lookups:
            if lookup in _installed:
                owner, attribute, original, users = _installed[lookup]
                _installed[lookup] = (owner, attribute, original, users + 1)
            else:
                owner, attribute = resolved[lookup]
                original = getattr(owner, attribute)
                setattr(owner, attribute, _recorder(lookup, original))
                _installed[lookup] = (owner, attribute, original, 1)
    builds: list[Build] = []
    token = _recording.set((op, builds))
    try:
        yield builds
    except VariantRecorded:
        pass
    finally:
        _recording.reset(token)
        with _lock:
            for lookup in lookups:
                owner, attribute, original, users = _installed[lookup]
                if users == 1:
                    setattr(owner, attribute, original)
                    del _installed[lookup]
                else:
                    _installed[lookup] = (owner, attribute, original, users - 1)
