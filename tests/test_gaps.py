"""Tunings after ready go in gaps of the GPU's serving work (buildops/_runtime/gaps.py). The device's stream is
faked here (no GPU on the CI machines): a sequence of answers to "is anything queued on it?"."""

import itertools

import pytest
import torch

from buildops import settings
from buildops._core.state import core
from buildops._runtime import gaps

GPU = torch.device("cuda", 0)  # only named: nothing here touches a GPU


@pytest.fixture
def stream(monkeypatch):
    """Answers to the stream's query, one per poll (the last repeated); how many polls were made."""
    answers, polls = [], []

    def idle(device):
        polls.append(device)
        return answers[min(len(polls), len(answers)) - 1]

    monkeypatch.setattr(gaps, "_stream_idle", idle)
    monkeypatch.setattr(gaps, "POLL_SECONDS", 0.001)
    return answers, polls


def test_a_tuning_waits_until_the_stream_has_been_idle_for_the_gap(stream):
    answers, polls = stream
    answers += [False] * 5 + [True, False] + [True]  # busy, a blip of idle, busy, then idle for good
    with settings.scope(tune_gap_ms=20):
        waited = gaps.wait_for_gap(GPU)
    assert waited >= 0.02 and len(polls) > 8  # the blip did not count: the gap is 20 ms idle in a row


def test_no_wait_off_a_gpu_with_the_setting_at_0_or_for_an_urgent_build(stream):
    answers, polls = stream
    answers.append(False)  # busy for good
    assert gaps.wait_for_gap(torch.device("cpu")) == 0.0
    with settings.scope(tune_gap_ms=0):
        assert gaps.wait_for_gap(GPU) == 0.0
    assert gaps.wait_for_gap(GPU, skip=lambda: True) < 0.05 and polls == []


def test_a_server_that_never_pauses_gets_the_tuning_after_the_wait_limit(stream, monkeypatch):
    answers, _ = stream
    answers.append(False)
    monkeypatch.setattr(gaps, "WAIT_LIMIT_SECONDS", 0.05)
    assert 0.05 <= gaps.wait_for_gap(GPU) < 1.0


def test_an_autotuning_build_waits_for_a_gap_only_after_ready(monkeypatch):
    pytest.importorskip("triton")
    from buildops.backends.triton import autotune

    from triton_kernels import scale_kernel

    order = []
    monkeypatch.setattr(autotune, "wait_for_gap", lambda device, skip: order.append(("gap", device)) or 0.0)

    def tuner_run(tuner, *args, **kwargs):
        order.append("tuned")
        tuner.best_config = "best"

    def tune():
        run = autotune._TuneRun(scale_kernel, (next(keys), "torch.float32"), (6, 7), {"grid": (1,)}, [], GPU,
                                tuner_run)
        monkeypatch.setattr(autotune, "run_admitted", lambda device, nbytes, make, run, what: run(make()))
        return run()

    keys = itertools.count(1000)
    monkeypatch.setattr(core, "ready_at", None)
    assert tune().value == "best" and order == ["tuned"]  # before ready: the start waits for it, no gap sought
    order.clear()
    monkeypatch.setattr(core, "ready_at", 1.0)
    assert tune().value == "best" and order == [("gap", GPU), "tuned"]  # after ready: a gap first
