"""The model: embeddings, blocks of [RMSNorm, simple GLA attention, RMSNorm, SwiGLU MLP], a norm and a head.

``ops`` chooses the kernels: :mod:`examples.fla_lm.ops` (decorated, the default) or :func:`plain_ops` (fla's ops
called directly), so that one model can be run both ways and compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 1024
    hidden: int = 512
    heads: int = 4
    layers: int = 2
    mlp: int = 1024


def plain_ops() -> Any:
    """fla's ops, undecorated."""
    from . import ops

    return SimpleNamespace(rms_norm=ops.rms_norm.__wrapped__, swiglu=ops.swiglu.__wrapped__,
                           simple_gla=ops.simple_gla.__wrapped__)


class Block(nn.Module):
    def __init__(self, config: Config, ops: Any) -> None:
        super().__init__()
        self.ops, self.heads = ops, config.heads
        self.norm1 = nn.Parameter(torch.ones(config.hidden))
        self.qkvg = nn.Linear(config.hidden, 3 * config.hidden + config.heads, bias=False)
        self.out = nn.Linear(config.hidden, config.hidden, bias=False)
        self.norm2 = nn.Parameter(torch.ones(config.hidden))
        self.gate_up = nn.Linear(config.hidden, 2 * config.mlp, bias=False)
        self.down = nn.Linear(config.mlp, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, hidden = x.shape
        h = self.ops.rms_norm(x, self.norm1)
        q, k, v, g = self.qkvg(h).split([hidden, hidden, hidden, self.heads], dim=-1)
        heads = (1, tokens, self.heads, hidden // self.heads)
        g = F.logsigmoid(g.float()).view(1, tokens, self.heads)
        o = self.ops.simple_gla(q.reshape(heads), k.reshape(heads), v.reshape(heads), g)
        x = x + self.out(o.reshape(tokens, hidden))
        gate, up = self.gate_up(self.ops.rms_norm(x, self.norm2)).chunk(2, dim=-1)
        return x + self.down(self.ops.swiglu(gate.contiguous(), up.contiguous()))


class Model(nn.Module):
    def __init__(self, config: Config, ops: Any = None) -> None:
        super().__init__()
        if ops is None:
            from . import ops as decorated

            ops = decorated
        self.ops = ops
        self.embed = nn.Embedding(config.vocab, config.hidden)
        self.blocks = nn.ModuleList(Block(config, ops) for _ in range(config.layers))
        self.norm = nn.Parameter(torch.ones(config.hidden))
        self.head = nn.Linear(config.hidden, config.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ops.rms_norm(x, self.norm))

