"""A transformers Llama model, made from a configuration in code, whose norms, MLP activation and rotary embedding
are fla's Triton ops: each ``LlamaRMSNorm``, ``LlamaMLP`` and ``LlamaAttention`` is given a subclass whose forward
calls them, with the same parameters (a checkpoint's names do not change), and the model's rotary embedding gives
per-token cos/sin tables of a fixed size. The rest (embedding, projections, attention, the KV cache) is
transformers' own, in plain torch.

``ops`` chooses the kernels: :mod:`examples.hf_fla.ops` (decorated, the default), or any namespace with
``rms_norm``, ``swiglu`` and ``rotary`` (:func:`~examples.hf_fla.ops.reference_ops` for plain torch).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import (
    ALL_ATTENTION_FUNCTIONS,
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    eager_attention_forward,
)


@dataclass(frozen=True)
class Config:
    vocab: int = 32000
    hidden: int = 3072
    layers: int = 12
    heads: int = 24
    kv_heads: int = 8
    intermediate: int = 8192
    max_batch: int = 8       # sequences in one request, all of one prompt length, decoded in step
    max_prompt: int = 2048
    max_new_tokens: int = 16
    rope_theta: float = 10000.0
    eps: float = 1e-5
    dtype: torch.dtype = torch.bfloat16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def max_tokens(self) -> int:
        """The most tokens one forward runs: a prefill of the largest batch at the longest prompt."""
        return self.max_batch * self.max_prompt

    def hf_config(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, hidden_act="silu", rms_norm_eps=self.eps,
                           max_position_embeddings=self.max_prompt + self.max_new_tokens,
                           rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
                           tie_word_embeddings=False, attn_implementation="sdpa")


SIZES = {
    "base": Config(),  # 1.4 B parameters, a 2.8 GB checkpoint
    "large": Config(layers=24),  # 2.6 B parameters, a 5.2 GB checkpoint
    # A hidden width over 512, as base's: fla's norm runs the same row kernel.
    "small": Config(vocab=512, hidden=1024, layers=2, heads=8, kv_heads=2, intermediate=2048, max_batch=2,
                    max_prompt=64, max_new_tokens=4),
}


class FlaRMSNorm(LlamaRMSNorm):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        width = hidden_states.shape[-1]
        out = self.ops.rms_norm(hidden_states.reshape(-1, width), self.weight, self.variance_epsilon)
        return out.view(hidden_states.shape)


class FlaMLP(LlamaMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        h = self.ops.swiglu(self.gate_proj(flat), self.up_proj(flat))
        return self.down_proj(h).view(*x.shape[:-1], -1)


class FlaAttention(LlamaAttention):
    """Llama's attention with queries and keys rotated together by fla's rotary kernel, tokens flattened."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, past_key_values: Any = None,
                **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, _ = hidden_states.shape
        heads = (batch, tokens, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(heads)
        k = self.k_proj(hidden_states).view(heads)
        v = self.v_proj(hidden_states).view(heads).transpose(1, 2)
        cos, sin = position_embeddings
        qk = torch.cat([q, k], dim=2).view(1, batch * tokens, -1, self.head_dim)
        qk = self.ops.rotary(qk, cos, sin).view(batch, tokens, -1, self.head_dim)
        q, k = qk[:, :, :q.shape[2]].transpose(1, 2), qk[:, :, q.shape[2]:].transpose(1, 2)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(batch, tokens, -1).contiguous()), weights


class TokenRotary(nn.Module):
    """Stands in for the model's rotary embedding: returns cos/sin tables of ``max_tokens`` rows whose first rows
    are the current forward's tokens' positions, in the order the attention flattens them (batch, then token)."""

    def __init__(self, config: Config, device: torch.device | str) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        angles = torch.outer(torch.arange(config.max_prompt + config.max_new_tokens, dtype=torch.float32,
                                          device=device), inv_freq)
        self.register_buffer("cos_table", angles.cos().to(config.dtype), persistent=False)
        self.register_buffer("sin_table", angles.sin().to(config.dtype), persistent=False)
        rows = (config.max_tokens, dim // 2)
        self.register_buffer("cos", torch.ones(rows, dtype=config.dtype, device=device), persistent=False)
        self.register_buffer("sin", torch.zeros(rows, dtype=config.dtype, device=device), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = position_ids.expand(x.shape[0], x.shape[1]).reshape(-1)
        tokens = positions.shape[0]
        if tokens > self.cos.shape[0]:
            raise ValueError(f"a forward of {tokens} tokens; the model was made for {self.cos.shape[0]} at most "
                             f"(Config.max_batch x Config.max_prompt)")
        self.cos[:tokens] = self.cos_table[positions]
        self.sin[:tokens] = self.sin_table[positions]
        return self.cos, self.sin


def use_fla(model: LlamaForCausalLM, config: Config, ops: Any = None) -> LlamaForCausalLM:
    """Give ``model``'s norms, MLPs and attentions the forwards above (in place) and its rotary embedding the
    token tables; returns it."""
    if ops is None:
        from . import ops as decorated

        ops = decorated
    swaps = {LlamaRMSNorm: FlaRMSNorm, LlamaMLP: FlaMLP, LlamaAttention: FlaAttention}
    for module in model.modules():
        swap = swaps.get(type(module))
        if swap is not None:
            module.__class__ = swap
            module.ops = ops
    model.model.rotary_emb = TokenRotary(config, model.device)
    return model


def create_model(config: Config, device: torch.device | str, ops: Any = None) -> LlamaForCausalLM:
    """The model on ``device``, its weights allocated but not initialised (load a checkpoint or
    :func:`dummy_weights` before running it)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config.hf_config())
    model = model.to(config.dtype).to_empty(device=device).eval()
    model.requires_grad_(False)
    return use_fla(model, config, ops)


def dummy_weights(model: nn.Module) -> None:
    """Small values in every weight, in two calls for all of them (each call hands back the GIL, which builder
    threads take in between)."""
    weights = list(model.parameters())
    torch._foreach_zero_(weights)
    torch._foreach_add_(weights, 0.01)


def make_checkpoint(path: str | os.PathLike, config: Config, seed: int = 0) -> Path:
    """Write random weights for ``config`` as a safetensors file (norms 1, matrices ~ N(0, 1/fan_in), the
    embedding N(0, 1)), as examples/tiny_llm does."""
    from examples.tiny_llm.checkpoint import save_random_weights

    with torch.device("meta"):
        model = LlamaForCausalLM(config.hf_config())
    # transformers keeps a Linear's weight as [out, in]: a matrix's fan-in is its second dim.
    return save_random_weights(model, path, config.dtype, repr(config), seed,
                               fan_in=lambda name, shape: 1 if "embed_tokens" in name else shape[1])
