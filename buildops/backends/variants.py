"""Variant recording: record which compiled variants an op's plan asks a library for, and build them on workers.

Some ops pick a compiled variant through a lookup: an attention wrapper's ``plan()`` asks FlashInfer for the module
of its head dim, dtypes and mask; a kernel table is keyed by config. Run the plan inside :func:`variants` with the
lookups named, and each lookup call on this thread is recorded as a build that calls the *real* lookup on a worker
(which compiles the variant, and leaves it in the library's own cache for the real plan to find).

The recorded call never returns: it raises :class:`VariantRecorded`, which ends the plan and is swallowed at the
end of the block. So nothing stands in for a real module, and a cache around the lookup (FlashInfer's getters are
``functools.cache``) can never keep a fake: the cached wrapper itself is not touched, only the name the plan looks
up, and only for the recording thread.

Its process-wide state is one object, :data:`variants_state`, at the end of this module: one module needs no
``state`` module of its own, and this one imports no library.
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
from .._runtime.forking import forget_in_child
from .._runtime.hooks import on_reset
from .._runtime.patching import Patch

__all__ = ["VariantRecorded", "variants"]


class VariantRecorded(Exception):
    """Raised by a recorded lookup to end the plan that called it (caught by :func:`variants`)."""


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
            recording = variants_state.recording.get()
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
    state = variants_state
    with state.patches_lock:
        # every one resolved before any is installed: a bad one leaves nothing patched
        patches = [state.patches.get(lookup) or _patch(lookup) for lookup in lookups]
        for lookup, patch in zip(lookups, patches):
            state.patches[lookup] = patch
    builds: list[Build] = []
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch.applied())
        token = state.recording.set((op, builds))
        try:
            yield builds
        except VariantRecorded:
            pass
        finally:
            state.recording.reset(token)


class VariantsState:
    """Variant recording's mutable process-wide state; one instance, :data:`variants_state`."""

    def __init__(self) -> None:
        # the recording of this context (thread or task): (op, the list its builds go to), or None
        self.recording: contextvars.ContextVar[tuple[str, list[Build]] | None] = contextvars.ContextVar(
            "buildops_variants", default=None)
        # lookup -> its patch, made at its first block and held only while a block records it
        self.patches: dict[str, Patch] = {}
        self.patches_lock = threading.Lock()

    def reset(self) -> None:
        """Nothing for ``buildops.testing.reset()`` to forget: a patch is held only within a block, and the patches
        made are kept for the next."""

    def after_fork(self) -> None:
        """In a forked child (its only thread; the parent's lock possibly held): a new lock."""
        self.patches_lock = threading.Lock()


variants_state = VariantsState()
forget_in_child(variants_state.after_fork)
on_reset.add(variants_state.reset)
