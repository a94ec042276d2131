"""The model's GEMMs are known from its configuration alone: an op family that queues their builds before the model
is allocated (``buildops.model_configured``), so that the allocation and the device's context overlap them; the
rehearsal later finds them queued and lists them as shared."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from buildops import Build

from . import kernels as K
from .model import Config, TinyLlm


class TinyLlmGemms:
    name = "tiny_llm.gemms"

    def recognizes(self, model: object, config: object) -> bool:
        return isinstance(config, Config) and (model is None or isinstance(model, TinyLlm))

    def builds(self, model: TinyLlm | None, config: Config) -> Iterator[Build]:
        for k, n in config.layer_gemms.values():
            # Meta tensors of the shapes a forward passes: nothing is allocated, and the op's own host code runs.
            tokens = torch.empty(config.max_tokens, k, dtype=config.dtype, device="meta")
            weight = torch.empty(k, n, dtype=config.dtype, device="meta")
            yield from K.matmul.builds_for(tokens, weight)  # at every swept M
