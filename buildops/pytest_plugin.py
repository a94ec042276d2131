"""buildops' pytest plugin, which pytest loads by itself wherever buildops is installed (entry point ``pytest11``,
name ``buildops``; ``-p no:buildops`` leaves it out).

It provides, without any import in the test suite:

* the fixture ``fresh_buildops``: the test starts and ends with no builder and no pending builds
  (:func:`buildops.testing.reset`, before and after);
* the fixture ``buildops_listings``: the whole test runs inside a
  :class:`~buildops.testing.ListingRecorder`, which the fixture returns, so that ops record what they list
  (and return their placeholders) instead of running;
* the option ``--buildops-late-compile=error|warn|ignore``: ``BUILDOPS_LATE_COMPILE`` for the whole run (left as
  it is without the option);
* the marker ``@pytest.mark.buildops_no_late_compiles``: the test fails if a kernel compiles late (on first use
  after a build pass) while it runs, with each late compile described.

Loading it imports no torch and no Triton: only what ``import buildops`` imports. The rest is imported when a
fixture or the marker is first used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .testing import ListingRecorder

__all__ = ["buildops_listings", "fresh_buildops"]

MARKER = "buildops_no_late_compiles"
_LATE_COMPILE_SCOPE = pytest.StashKey[contextlib.ExitStack]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("buildops")
    group.addoption("--buildops-late-compile", choices=("error", "warn", "ignore"), default=None,
                    dest="buildops_late_compile",
                    help="what a kernel compiled on first use after a build pass does in this run: error (raise "
                         "into the call), warn (log once) or ignore (only record); default: BUILDOPS_LATE_COMPILE")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: fail the test if a kernel compiles late (on first use after a "
                                       "build pass) while it runs")
    mode = config.getoption("buildops_late_compile", default=None)
    if mode is not None:
        from ._config import settings

        scope = contextlib.ExitStack()
        scope.enter_context(settings.scope(late_compile=mode))
        config.stash[_LATE_COMPILE_SCOPE] = scope


def pytest_unconfigure(config: pytest.Config) -> None:
    scope = config.stash.get(_LATE_COMPILE_SCOPE, None)
    if scope is not None:
        del config.stash[_LATE_COMPILE_SCOPE]
        scope.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker(MARKER) is None:
        return (yield)
    from ._core.late import late_compiles

    before = late_compiles()  # kept, so that their ids stay theirs: later ones are what the test compiled
    seen = {id(late) for late in before}
    result = yield
    new = [late for late in late_compiles() if id(late) not in seen]
    if new:
        lines = "\n".join(f"  {late.describe()}" for late in new)
        pytest.fail(f"{MARKER}: {len(new)} kernel(s) compiled late (on first use after a build pass) during this "
                    f"test:\n{lines}\nList them in a build pass: sweep the dims they vary in, or call the ops that "
                    "launch them in the pass", pytrace=False)
    return result


@pytest.fixture
def fresh_buildops() -> Iterator[None]:
    """A test that starts and ends with no builder, no pending builds and no late compiles recorded
    (:func:`buildops.testing.reset`); settings are the test's own."""
    from .testing import reset

    reset()
    yield
    reset()


@pytest.fixture
def buildops_listings(request: pytest.FixtureRequest) -> Iterator[ListingRecorder]:
    """A :class:`~buildops.testing.ListingRecorder` active for the whole test: ops record what they list and
    return their placeholders; nothing is built. Assert on it at the end of the test:
    ``assert buildops_listings.dims("rmsnorm") == [...]``."""
    from .testing import record_listings

    recorder = record_listings(request.node.name)
    with recorder:
        yield recorder
