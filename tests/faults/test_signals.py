"""A Ctrl-C (a real SIGINT to the main thread) in a pass cancels the queued builds only that pass wanted, and the
ops' calls after it do not wait for them."""

import logging
import signal
import threading

import pytest
import torch

import buildops
from buildops import BuildState, build_pass, rehearsal, report, settings
from buildops._core.default import default_builder
from buildops.startup import rehearse_then_load

from conftest import WAIT, op_listing, waiting_on

# How long a call whose builds were cancelled may take: it waits for nothing, so any bound well under WAIT (for
# which a held build stays held) tells a prompt call from one that waits.
PROMPT = 2.0


@pytest.fixture
def ctrl_c():
    """``ctrl_c(began)``: once ``began`` is set, send SIGINT to the main thread, as a terminal's Ctrl-C does."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own: KeyboardInterrupt
    threads = []

    def send(began):
        def interrupt():
            if began.wait(WAIT):
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        thread = threading.Thread(target=interrupt, daemon=True)
        thread.start()
        threads.append(thread)

    yield send
    for thread in threads:
        thread.join(WAIT)
    signal.signal(signal.SIGINT, previous)


def call_returns_within(op, x, seconds):
    """Call ``op(x)`` on a thread, as serving does; True if it returned within ``seconds``."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (op(x), done.set()), daemon=True)
    thread.start()
    return done.wait(seconds)


def test_a_ctrl_c_while_the_pass_end_waits_cancels_its_queued_builds(runs, ctrl_c, caplog):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    with settings.scope(threads=1):
        builder = default_builder()  # one worker
    began = waiting_on(builder)  # the end of the pass waits through builder.wait
    try:
        with caplog.at_level(logging.INFO, logger="buildops"), pytest.raises(KeyboardInterrupt), \
                build_pass("warmup"):
            for n in range(1, 6):
                op(torch.empty(4, n))
            assert runs.started.wait(WAIT)  # the first build holds the only worker; four are queued
            ctrl_c(began)
        assert [builder.state(("op", n)) for n in range(1, 6)] == [BuildState.BUILDING] + [None] * 4
        stats = report().ops[0]
        assert (stats.listed, stats.built, stats.cancelled, stats.pending) == (5, 0, 4, 1)
        assert "pass 'warmup' was interrupted by KeyboardInterrupt while waiting for its builds; cancelled 4" \
            in caplog.text
        # A serving call of a shape whose build was cancelled waits for nothing, while the held build still runs.
        assert call_returns_within(op, torch.ones(4, 5), PROMPT)
    finally:
        gate.set()
    assert buildops.join(timeout=WAIT)
    assert runs.calls == [("op", 1)]


def test_a_ctrl_c_in_a_nested_pass_cancels_what_only_the_interrupted_passes_wanted(runs, ctrl_c):
    gate = threading.Event()
    blocker = op_listing(runs, name="blocker", gate=gate)
    op = op_listing(runs)
    with settings.scope(threads=1):
        builder = default_builder()  # one worker
    try:
        with rehearsal("earlier"):  # wants ("op", 6): the interrupted passes must leave it queued
            blocker(torch.empty(4, 1))
            op(torch.empty(4, 6))
        assert runs.started.wait(WAIT)  # the blocker holds the only worker
        began = waiting_on(builder)
        with pytest.raises(KeyboardInterrupt), build_pass("outer"):
            op(torch.empty(4, 1))
            op(torch.empty(4, 6))
            with rehearsal("inner"):
                op(torch.empty(4, 2))
                ctrl_c(began)
                buildops.join(timeout=WAIT)  # the body waits for builds, and the Ctrl-C comes
        assert [builder.state(("op", n)) for n in (1, 2)] == [None, None]
        assert builder.state(("op", 6)) is BuildState.QUEUED
        assert builder.stats()["op"].cancelled == 2
        assert call_returns_within(op, torch.ones(4, 2), PROMPT)  # the inner pass's build: cancelled
        assert call_returns_within(op, torch.ones(4, 1), PROMPT)  # the outer pass's own
    finally:
        gate.set()
    assert buildops.join(timeout=WAIT)
    assert runs.calls == [("blocker", 1), ("op", 6)]


@pytest.mark.parametrize("where", ["the wait until ready", "the load", "the load beside the rehearsal"])
def test_a_ctrl_c_in_a_start_cancels_the_rehearsals_queued_builds(runs, ctrl_c, where):
    gate = threading.Event()
    op = op_listing(runs, gate=gate)
    with settings.scope(threads=1):
        builder = default_builder()  # one worker

    def rehearse():
        for n in range(1, 4):
            op(torch.empty(4, n))
        assert runs.started.wait(WAIT)  # the first build holds the only worker; two are queued

    def load():
        if where == "the load beside the rehearsal":  # the interrupt comes once the rehearsal queued its builds
            assert runs.started.wait(WAIT)
        if where != "the wait until ready":
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of reading the checkpoint

    if where == "the wait until ready":  # the rehearsal queues without waiting: the first wait is the start's
        ctrl_c(waiting_on(builder))
    try:
        with pytest.raises(KeyboardInterrupt):
            rehearse_then_load(rehearse, load, overlap=where == "the load beside the rehearsal")
        assert [builder.state(("op", n)) for n in range(1, 4)] == [BuildState.BUILDING, None, None]
        assert builder.stats()["op"].cancelled == 2
        assert call_returns_within(op, torch.ones(4, 3), PROMPT)
    finally:
        gate.set()
    assert buildops.join(timeout=WAIT)
    assert runs.calls == [("op", 1)]
