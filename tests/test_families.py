from dataclasses import dataclass

import pytest
from torch import nn

import buildops
from buildops import Build, build_pass, model_configured, model_created, register_family, report, unregister_family
from buildops.testing import record_listings

from conftest import WAIT


@dataclass(frozen=True)
class Config:
    width: int


class FromConfig:
    """Lists from the configuration alone: one build per width."""
    name = "from_config"

    def __init__(self):
        self.ran = []

    def recognizes(self, model, config):
        return isinstance(config, Config)

    def builds(self, model, config):
        return [Build("from_config", ("from_config", config.width), lambda: self.ran.append(config.width))]


class NeedsModel:
    """Written as if only model_created asked it: reads the model's modules without looking at model first."""
    name = "needs_model"

    def recognizes(self, model, config):
        return isinstance(config, Config)

    def builds(self, model, config):
        return [Build("needs_model", ("needs_model", type(m).__name__), lambda: None) for m in model.modules()]


@pytest.fixture
def families():
    registered = []

    def register(family):
        registered.append(register_family(family))
        return family

    yield register
    for family in registered:
        unregister_family(family)


def test_model_configured_queues_before_the_model_and_model_created_shares_them(families):
    family = families(FromConfig())
    with build_pass("warmup"):
        queued = model_configured(Config(8))
        assert len(queued) == 1
        assert model_created(nn.Linear(2, 2), Config(8)) == queued  # the same key: shared, not built again
    assert family.ran == [8]
    assert next(op for op in report().ops if op.op == "from_config").shared == 1
    first = model_configured(Config(16))  # no pass: straight to the builder
    assert buildops.join(timeout=WAIT) and first[0].done() and family.ran == [8, 16]
    with record_listings() as rec:  # listings name the call by its (hashable) configuration
        model_configured(Config(32))
    assert rec.signatures("from_config") == [("model_configured", Config(32))]
    assert rec.keys("from_config") == [("from_config", 32)]


def test_a_family_that_needs_the_model_gets_a_clear_error_before_it_exists(families):
    families(NeedsModel())
    with pytest.raises(TypeError, match=r"family .needs_model. failed .*model=None.* recognizes\(\) return False"):
        model_configured(Config(8))
    assert len(model_created(nn.Sequential(nn.Linear(2, 2)), Config(8))) == 2  # with the model it lists as before
    assert buildops.join(timeout=WAIT)
