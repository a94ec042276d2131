"""A Llama-like decoder (RMSNorm, fused QKV, RoPE, grouped-query attention, SwiGLU) built from the Triton ops in
``kernels.py``, serving one sequence at a time with a KV cache, and a torch reference of the same math."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernels as K


@dataclass(frozen=True)
class Config:
    vocab: int = 32000
    hidden: int = 3072
    layers: int = 24
    heads: int = 24
    kv_heads: int = 8
    intermediate: int = 8192
    max_tokens: int = 512   # the largest prompt (context batch) served; the rehearsal uses it
    max_seq: int = 1024     # prompt plus generated tokens
    rope_theta: float = 10000.0
    eps: float = 1e-5
    dtype: torch.dtype = torch.bfloat16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def layer_gemms(self) -> dict[str, tuple[int, int]]:
        """Each layer's GEMM weights and their shapes [K, N]: what a layer allocates, and what the GEMM family
        lists builds for before any layer exists."""
        return {"qkv": (self.hidden, self.qkv_width), "o": (self.heads * self.head_dim, self.hidden),
                "gate_up": (self.hidden, 2 * self.intermediate), "down": (self.intermediate, self.hidden)}


SIZES = {
    "base": Config(),  # 2.6 B parameters, a 5.2 GB checkpoint
    "small": Config(vocab=512, hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256, max_tokens=64,
                    max_seq=128),
}


class Layer(torch.nn.Module):
    def __init__(self, config: Config, device: torch.device) -> None:
        super().__init__()

        def weight(*shape: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape, dtype=config.dtype, device=device), requires_grad=False)

        gemms = config.layer_gemms
        self.attn_norm = weight(config.hidden)
        self.qkv = weight(*gemms["qkv"])
        self.o = weight(*gemms["o"])
        self.mlp_norm = weight(config.hidden)
        self.gate_up = weight(*gemms["gate_up"])
        self.down = weight(*gemms["down"])
        cache = (config.max_seq, config.kv_heads, config.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache, dtype=config.dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache, dtype=config.dtype, device=device), persistent=False)


class TinyLlm(torch.nn.Module):
    """Weights are allocated, not initialised: load a checkpoint (or :meth:`dummy_weights`) before serving."""

    def __init__(self, config: Config, device: torch.device | str = "cuda") -> None:
        super().__init__()
        self.config = config
        device = torch.device(device)
        self.embed = torch.nn.Parameter(torch.empty(config.vocab, config.hidden, dtype=config.dtype, device=device),
                                        requires_grad=False)
        self.layers = torch.nn.ModuleList(Layer(config, device) for _ in range(config.layers))
        self.norm = torch.nn.Parameter(torch.empty(config.hidden, dtype=config.dtype, device=device),
                                       requires_grad=False)
        self.lm_head = torch.nn.Parameter(torch.empty(config.hidden, config.vocab, dtype=config.dtype,
                                                      device=device), requires_grad=False)
        self.register_buffer("cos_sin", K.rope_cache(config.max_seq, config.head_dim, config.rope_theta, device),
                             persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def dummy_weights(self) -> None:
        """Small values in every weight: what a rehearsal runs on before the checkpoint arrives."""
        # Two calls for all weights, not a fill_ each: every call hands back the GIL, and during a start the
        # builder's and the preparation's threads take it in between (~220 fills took 0.1-0.4 s).
        weights = list(self.parameters())
        torch._foreach_zero_(weights)
        torch._foreach_add_(weights, 0.01)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Run ``ids`` (int32 [M]) at positions ``start..start+M-1``, filling the KV cache; return the last
        position's logits (fp32 [1, vocab]). ``start == 0`` is a prompt (context), else one decode step."""
        c = self.config
        n = ids.shape[0]
        positions = torch.arange(start, start + n, dtype=torch.int32, device=ids.device)
        seq_len = torch.full((1,), start + n, dtype=torch.int32, device=ids.device)
        x = K.embedding(ids, self.embed)
        residual = None
        for layer in self.layers:
            if residual is None:
                h, residual = K.rmsnorm(x, layer.attn_norm, c.eps), x
            else:
                h, residual = K.add_rmsnorm(x, residual, layer.attn_norm, c.eps)
            qkv = K.matmul(h, layer.qkv)
            q, k = K.rope(qkv, positions, self.cos_sin, c.heads, c.kv_heads)
            v = qkv[:, (c.heads + c.kv_heads) * c.head_dim:].view(n, c.kv_heads, c.head_dim)
            layer.k_cache[start:start + n] = k
            layer.v_cache[start:start + n] = v
            if start == 0:
                attn = K.context_attention(q, k, v)
            else:
                attn = K.decode_attention(q, layer.k_cache, layer.v_cache, seq_len)
            x = K.matmul(attn.view(n, c.heads * c.head_dim), layer.o)
            h, residual = K.add_rmsnorm(x, residual, layer.mlp_norm, c.eps)
            x = K.matmul(K.silu_mul(K.matmul(h, layer.gate_up)), layer.down)
        h, _ = K.add_rmsnorm(x[-1:], residual[-1:], self.norm, c.eps)
        return K.matmul(h, self.lm_head, torch.float32)

    def rehearse(self) -> None:
        """The dummy forwards of a startup: one context batch at the maximum token count, one decode step."""
        ids = torch.zeros(self.config.max_tokens, dtype=torch.int32, device=self.device)
        self(ids, 0)
        self(ids[:1], self.config.max_tokens)

    def warm_request(self) -> None:
        """One short real request at the shapes the rehearsal called (a context batch at the maximum token count,
        one decode step), greedy sampling included, on the loaded weights: what a process does once for a request
        (``rehearse_then_load``'s ``warm``) is then done before the first one."""
        self.generate([0] * self.config.max_tokens, 2)

    @torch.inference_mode()
    def generate(self, prompt: list[int], new_tokens: int) -> list[int]:
        """Greedy decoding of one request."""
        ids = torch.tensor(prompt, dtype=torch.int32, device=self.device)
        logits = self(ids, 0)
        out: list[int] = []
        for step in range(new_tokens):
            token = logits.argmax(dim=-1).to(torch.int32)
            out.append(int(token.item()))
            if step + 1 < new_tokens:
                logits = self(token, len(prompt) + step)
        return out


@torch.inference_mode()
def reference_logits(model: TinyLlm, ids: torch.Tensor) -> torch.Tensor:
    """The last position's logits of a prompt, in plain torch (fp32 math on the same weights)."""
    c = model.config
    n = ids.shape[0]
    f = lambda t: t.float()  # noqa: E731

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps) * f(w)

    cos, sin = model.cos_sin[:n, :c.head_dim // 2], model.cos_sin[:n, c.head_dim // 2:]

    def rotate(x):  # [n, heads, D]
        x1, x2 = x[..., :c.head_dim // 2], x[..., c.head_dim // 2:]
        return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)

    x = f(model.embed[ids.long()])
    mask = torch.full((n, n), float("-inf"), device=x.device).triu(1)
    for layer in model.layers:
        qkv = norm(x, layer.attn_norm) @ f(layer.qkv)
        q = rotate(qkv[:, :c.heads * c.head_dim].view(n, c.heads, c.head_dim))
        k = rotate(qkv[:, c.heads * c.head_dim:(c.heads + c.kv_heads) * c.head_dim].view(n, c.kv_heads, c.head_dim))
        v = qkv[:, (c.heads + c.kv_heads) * c.head_dim:].view(n, c.kv_heads, c.head_dim)
        group = c.heads // c.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / c.head_dim ** 0.5 + mask
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
        x = x + attn @ f(layer.o)
        gate, up = (norm(x, layer.mlp_norm) @ f(layer.gate_up)).chunk(2, -1)
        x = x + (torch.nn.functional.silu(gate) * up) @ f(layer.down)
    return norm(x[-1:], model.norm) @ f(model.lm_head)
