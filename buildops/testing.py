"""Helpers for tests: record what ops list without building anything, and reset buildops between tests.

    from buildops.testing import Signature, record_listings

    def test_rmsnorm_lists_one_build_per_pow2_batch():
        with record_listings() as rec:
            rmsnorm(torch.empty(100, 4096, dtype=torch.float16), weight)
        assert [d["x.0"] for d in rec.dims("rmsnorm")] == [1, 2, 4, 8, 16, 32, 64, 100]
        assert rec.signatures("rmsnorm") == [
            Signature(x=("float16", "cpu", (None, 4096)), weight=("float16", "cpu", (4096,)), eps=1e-6)]

In a pytest suite, the ``fresh_buildops`` fixture of buildops' pytest plugin (loaded by pytest wherever buildops is
installed) gives every test that asks for it a process with no builder and no pending builds (settings are the
test's own: its environment and ``settings.scope``); ``buildops_listings`` records what the test's ops list.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ._config import forget_logged
from ._core.build import Build
from ._core.default import current_builder, shutdown
from ._core.passes import BuildPass
from ._core.signatures import ModuleSignature, Signature, TensorSignature, readable
from ._runtime.hooks import on_reset

__all__ = ["Listing", "ListingRecorder", "ModuleSignature", "Signature", "TensorSignature", "fresh_buildops",
           "record_listings", "reset"]

logger = logging.getLogger("buildops")


@dataclass(frozen=True)
class Listing:
    """What one op listed for one swept shape of one call signature.

    ``signature`` is the call signature as the pass keys it (hashable, not meant to be read);
    :meth:`ListingRecorder.signatures` gives it in readable form.
    """

    op: str
    signature: Hashable
    dims: Mapping[str, int]
    builds: tuple[Build, ...]

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The listed builds' keys, in order."""
        return tuple(b.key for b in self.builds)


class ListingRecorder(BuildPass):
    """A build pass that records listings instead of queueing builds. Ops inside it return their placeholders.

    Args:
        name: the pass's name in logs and errors.
    """

    arms_late_compiles = False  # nothing was built, so nothing compiled afterwards is a gap
    lists_apart = True  # inside a real pass too, it sees every call, and leaves the pass to queue them
    lists_sweep_later = False  # what a test reads at the end of its block is every shape's

    def __init__(self, name: str = "record") -> None:
        super().__init__(name, join_at_exit=False)
        self.listings: list[Listing] = []

    def take(self, op: str, signature: Hashable, dims: Mapping[str, int], builds: Iterable[Build]) -> list:
        """Record the builds an op listed for one swept shape; queue nothing, so there are no futures."""
        self.listings.append(Listing(op, signature, dict(dims), tuple(builds)))
        return []

    def start_early(self, build: Build) -> None:
        """Start nothing: a recording queues no build."""

    def of(self, op: str) -> list[Listing]:
        """The listings of ``op``, in order: by its name, or by its short name (``"norm"`` for an op named
        ``"tests.test_x.norm"``, qualified where another op in the process has that name) where no other op in this
        recording has that short name.

        Raises:
            ValueError: two ops of this recording have that short name; name the one meant in full.
        """
        exact = [entry for entry in self.listings if entry.op == op]
        if exact:
            return exact
        named = {entry.op for entry in self.listings if entry.op.endswith("." + op)}
        if len(named) > 1:
            raise ValueError(f"{op!r} names {len(named)} ops in this recording: {sorted(named)}; name one in full")
        return [entry for entry in self.listings if entry.op in named]

    def ops(self) -> list[str]:
        """The ops that listed anything, in the order they first did."""
        return list(dict.fromkeys(entry.op for entry in self.listings))

    def signatures(self, op: str) -> list[Any]:
        """The distinct call signatures ``op`` listed for, in order, each a :class:`Signature` (a family's listings
        keep the signature the family gave them)."""
        return [readable(signature) for signature in dict.fromkeys(entry.signature for entry in self.of(op))]

    def dims(self, op: str) -> list[Mapping[str, int]]:
        """The swept shapes ``op`` listed, in order, one per listing."""
        return [entry.dims for entry in self.of(op)]

    def keys(self, op: str | None = None) -> list[Hashable]:
        """The build keys listed (by ``op``, or by every op), in order, repeats included."""
        entries = self.listings if op is None else self.of(op)
        return [key for entry in entries for key in entry.keys]


def record_listings(name: str = "record") -> ListingRecorder:
    """A pass that records what ops list without building: ``with record_listings() as rec: ...``.

    Args:
        name: the pass's name in logs and errors.
    """
    return ListingRecorder(name)


def reset(timeout: float = 10.0) -> None:
    """Forget the process's builder (cancel queued builds, stop its workers, drop every op's pending builds), the
    late compiles recorded so far, which ops listed which kernels and which bad settings were logged; late-compile
    detection starts again after the next pass.

    Args:
        timeout: seconds to wait for running builds; one still running then is left to its (daemon) thread.
    """
    builder = current_builder()
    shutdown(wait=True, timeout=timeout)
    forget_logged()  # a bad setting's value read while serving is logged again
    on_reset.run()  # each layer forgets what its passes noted (late compiles, which ops listed which kernels, ...)
    if builder is not None and builder.busy:
        logger.warning("buildops.testing.reset: %d build(s) still running after %.0f s", builder.busy, timeout)


try:
    import pytest
except ImportError:  # pytest is only needed to use the fixture
    pass
else:
    @pytest.fixture
    def fresh_buildops() -> Iterator[None]:
        """A test that starts and ends with no builder and no pending builds."""
        reset()
        yield
        reset()
