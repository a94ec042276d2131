"""Variant recording: record which compiled variants an op's plan asks a library for, and build them on workers.

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

from .._core.build import Build
from .._runtime.patching import Patch

__all__ = ["VariantRecorded", "variants"]


class VariantRecorded(Exception):
    """Raised by a recorded lookup to end the plan that called it (caught by :func:`variants`)."""


_recording: contextvars.ContextVar[tuple[str, list[Build]] | None] = contextvars.ContextVar(
    "buildops_variants", default=None)
_lock = threading.Lock()
_patches: dict[str, Patch] = {}  # one per lookup, held while a block records it


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _recorder(lookup: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def lookup_or_record(*args: Any, **kwargs: Any) -> Any:
            recording = _recording.get()
            if recording is None:  # another thread, or outside the block: the real lookup
                return original(*args, **kwargs)
            op, builds = recording
            key = ("variant", lookup, tuple(map(_hashable, args)),
                   tuple(sorted((k, _hashable(v)) for k, v in kwargs.items())))
            builds.append(Build(op, key, functools.partial(original, *args, **kwargs),
                                label=f"{lookup.rpartition('.')[2]}{args}", library=lookup.split(".")[0]))
            raise VariantRecorded(lookup)
        return lookup_or_record
    return make


def _patch(lookup: str) -> Patch:
    module_name, _, attribute = lookup.rpartition(".")
    if not module_name:
        raise ValueError(f"variants: {lookup!r} is not a dotted path like 'flashinfer.decode.get_batch_decode_module'")
    owner = importlib.import_module(module_name)
    if not hasattr(owner, attribute):
        raise ValueError(f"variants: module {module_name} has no {attribute!r}")
    return Patch(owner, attribute, _recorder(lookup), "a library's plan (FlashInfer 0.7's wrappers) compiles "
                 "its variant inside the lookup, with no hook to record it instead")


@contextlib.contextmanager
def variants(op: str, *lookups: str) -> Iterator[list[Build]]:
    """Record the calls this thread makes to the named lookups as builds, appended to the yielded list.

    The first recorded call ends the block's plan (raising :class:`VariantRecorded`, swallowed here): one plan
    call, one variant. Return the builds from an op's lister or a family's ``builds()``.

    Args:
        op: the op the builds are reported under.
        *lookups: the lookups to record, as dotted paths (``flashinfer.decode.get_batch_decode_module``).
    """
    with _lock:
        # every one resolved before any is installed: a bad one leaves nothing patched
        patches = [_patches.get(lookup) or _patch(lookup) for lookup in lookups]
        for lookup, patch in zip(lookups, patches):
            _patches[lookup] = patch
    builds: list[Build] = []
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch.applied())
        token = _recording.set((op, builds))
        try:
            yield builds
        except VariantRecorded:
            pass
        finally:
            _recording.reset(token)
