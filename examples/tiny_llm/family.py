"""The model's GEMMs are known from its configuration alone: an op family that queues their builds as soon as the
model exists, before the dummy weights and the rehearsal (which finds them queued and lists them as shared)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from buildops import Build

from . import kernels as K
from .model import Config, TinyLlm


class TinyLlmGemms:
    name = "tiny_llm.gemms"

    def recognizes(self, model: object, config: object) -> bool:
        return isinstance(model, TinyLlm) and isinstance(config, Config)

    def builds(self, model: TinyLlm, config: Config) -> Iterator[Build]:
        layer = model.layers[0]
        for weight in (layer.qkv, layer.o, layer.gate_up, layer.down):
            tokens = torch.empty(config.max_tokens, weight.shape[0], dtype=config.dtype, device="meta")
            yield from K.matmul.builds_for(tokens, weight)  # the op's own host code, at every swept M
