"""The model's hot ops: Triton kernels behind buildops-decorated functions.

Every op takes the token count as dim 0 of its first tensor and sweeps it with ``"pow2_odd"``: each power of two up
to the count the rehearsal passes (the maximum), and the odd size below each, because Triton compiles a token
count that is a multiple of 16 and one that is not as two kernels, and a prompt may have either. None of them has
a hand-written lister: buildops lists each by replaying its host code on fake tensors.

The matmul is autotuned, keyed on the power-of-two bucket of M rather than M itself, so that the tuning (which
buildops runs in the build, on a GPU) is done once per bucket, not again for every new prompt length; buckets
start at the smallest tile's height, since below it every M runs the same tiles on the same work.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from buildops import BuildConfig, DynamicSpec, lists_kernels


def _tokens(*others: str) -> BuildConfig:
    """The token dim of the first tensor, swept; ``others`` are tensors whose dim 0 is the same token count."""
    return BuildConfig(DynamicSpec("x", 0, sweep="pow2_odd"),
                       *(DynamicSpec(name, 0, follows="x.0") for name in others))


# -- embedding ------------------------------------------------------------------------------------------------

@triton.jit
def _embedding_kernel(ids_ptr, table_ptr, out_ptr, hidden, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    token = tl.load(ids_ptr + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    tl.store(out_ptr + row * hidden + cols, tl.load(table_ptr + token * hidden + cols, mask=mask), mask=mask)


@lists_kernels(_tokens(), output=lambda x, table: torch.zeros(x.shape[0], table.shape[1], dtype=table.dtype,
                                                              device=table.device))
def embedding(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` for the token ids ``x``."""
    out = torch.empty(x.shape[0], table.shape[1], dtype=table.dtype, device=table.device)
    hidden = table.shape[1]
    _embedding_kernel[(x.shape[0],)](x, table, out, hidden, BLOCK=triton.next_power_of_2(hidden))
    return out


# -- RMSNorm, alone and fused with the residual add ----------------------------------------------------------

@triton.jit
def _rmsnorm_kernel(x_ptr, residual_ptr, w_ptr, out_ptr, residual_out_ptr, hidden, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(residual_out_ptr.dtype.element_ty)  # the residual stream is kept in the model's dtype
        tl.store(residual_out_ptr + row * hidden + cols, x, mask=mask)
        x = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@lists_kernels(_tokens(), output="x")
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    hidden = x.shape[1]
    _rmsnorm_kernel[(x.shape[0],)](x, x, weight, out, out, hidden, eps, HAS_RESIDUAL=False,
                                   BLOCK=triton.next_power_of_2(hidden))
    return out


@lists_kernels(_tokens("residual"), output=lambda x, residual, weight, eps: (torch.zeros_like(x),
                                                                             torch.zeros_like(x)))
def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rmsnorm(x + residual), x + residual)``."""
    out, summed = torch.empty_like(x), torch.empty_like(x)
    hidden = x.shape[1]
    _rmsnorm_kernel[(x.shape[0],)](x, residual, weight, out, summed, hidden, eps, HAS_RESIDUAL=True,
                                   BLOCK=triton.next_power_of_2(hidden))
    return out, summed


# -- matmul: x @ w, autotuned per power-of-two bucket of M ---------------------------------------------------

def _matmul_configs() -> list[triton.Config]:
    tiles = ((16, 64, 4, 4), (16, 128, 4, 4), (32, 128, 4, 4), (64, 128, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3))
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64}, num_warps=w, num_stages=s)
            for m, n, w, s in tiles]


_SHORTEST_TILE = min(config.kwargs["BLOCK_M"] for config in _matmul_configs())


def _m_bucket(m: int) -> int:
    """The tuning key's bucket of M: its next power of two, but none below the shortest tile. M = 1..16 all run
    one row of 16-row tiles, so tuning them apart would time the same two configs on the same work five times
    (and a bucket below every tile would leave the pruning nothing to keep)."""
    return max(_SHORTEST_TILE, triton.next_power_of_2(m))


def _prune_tall_tiles(configs, named_args, **kwargs):
    """Tiles taller than M's bucket only compute padding."""
    return [c for c in configs if c.kwargs["BLOCK_M"] <= named_args["M_BUCKET"]]


def _quick_bench(fn, quantiles):
    # Short timing windows: tuning runs once per (bucket, N, K), and a startup pays for all of them. do_bench
    # fits as many runs into the window as it holds (each a fraction of a millisecond here). 1 ms of warmup and
    # 5 of repeats, against 2 and 10, cut the startup's 25 tunes from 1.5-1.7 s to 0.9-1.1 s on the H200 host
    # with the same steady latency and tokens (docs/benchmarks.md, seventh session).
    return triton.testing.do_bench(fn, warmup=1, rep=5, quantiles=quantiles)


@triton.autotune(configs=_matmul_configs(), key=["M_BUCKET", "N", "K"],
                 prune_configs_by={"early_config_prune": _prune_tall_tiles}, do_bench=_quick_bench,
                 cache_results=True)  # the choices go to Triton's cache dir: a restart times nothing
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, M_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _matmul_out(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.zeros(x.shape[0], w.shape[1], dtype=out_dtype or x.dtype, device=x.device)


@lists_kernels(_tokens(), output=_matmul_out)
def matmul(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x @ w`` for contiguous ``x`` [M, K] and ``w`` [K, N], in ``out_dtype`` (default: x's)."""
    m, k = x.shape
    n = w.shape[1]
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    _matmul_kernel[grid](x, w, out, m, n, k, _m_bucket(m))
    return out


# -- rotary embedding: q and k out of the fused QKV projection ----------------------------------------------

@triton.jit
def _rope_kernel(qkv_ptr, positions_ptr, cos_sin_ptr, q_ptr, k_ptr, qkv_stride,
                 HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)  # heads 0..HEADS-1 are q's, then k's
    half = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM // 2)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + position * HEAD_DIM + d)
    sin = tl.load(cos_sin_ptr + position * HEAD_DIM + half + d)
    source = qkv_ptr + token * qkv_stride + head * HEAD_DIM
    x1 = tl.load(source + d).to(tl.float32)
    x2 = tl.load(source + half + d).to(tl.float32)
    if head < HEADS:
        target = q_ptr + (token * HEADS + head) * HEAD_DIM
    else:
        target = k_ptr + (token * KV_HEADS + head - HEADS) * HEAD_DIM
    tl.store(target + d, (x1 * cos - x2 * sin).to(q_ptr.dtype.element_ty))
    tl.store(target + half + d, (x2 * cos + x1 * sin).to(q_ptr.dtype.element_ty))


def _rope_out(x, positions, cos_sin, heads, kv_heads):
    head_dim = cos_sin.shape[1]
    return (torch.zeros(x.shape[0], heads, head_dim, dtype=x.dtype, device=x.device),
            torch.zeros(x.shape[0], kv_heads, head_dim, dtype=x.dtype, device=x.device))


@lists_kernels(_tokens("positions"), output=_rope_out)
def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int,
         kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q [M, heads, D] and k [M, kv_heads, D] from the QKV projection ``x`` (neox-style halves)."""
    head_dim = cos_sin.shape[1]
    q = torch.empty(x.shape[0], heads, head_dim, dtype=x.dtype, device=x.device)
    k = torch.empty(x.shape[0], kv_heads, head_dim, dtype=x.dtype, device=x.device)
    _rope_kernel[(x.shape[0], heads + kv_heads)](x, positions, cos_sin, q, k, x.stride(0), HEADS=heads,
                                                 KV_HEADS=kv_heads, HEAD_DIM=head_dim)
    return q, k


def rope_cache(max_positions: int, head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim]: cos in the first half of each row, sin in the second (fp32)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=1).contiguous()


# -- SwiGLU ---------------------------------------------------------------------------------------------------

@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


@lists_kernels(_tokens(), output=lambda x: torch.zeros(x.shape[0], x.shape[1] // 2, dtype=x.dtype,
                                                       device=x.device))
def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]``."""
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    _silu_mul_kernel[(x.shape[0], triton.cdiv(inter, 1024))](x, out, inter, BLOCK=1024)
    return out


# -- attention ------------------------------------------------------------------------------------------------

@triton.jit
def _context_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, n_tokens, stride_q, stride_k, stride_v, stride_o, scale,
                              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    block_m, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // GROUP
    rm = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rm[:, None] * stride_q + head * HEAD_DIM + rd[None, :], mask=rm[:, None] < n_tokens,
                other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    end = tl.minimum((block_m + 1) * BLOCK_M, n_tokens)
    for start in range(0, end, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        valid = rn[:, None] < n_tokens
        k = tl.load(k_ptr + rn[:, None] * stride_k + kv_head * HEAD_DIM + rd[None, :], mask=valid, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where((rn[None, :] <= rm[:, None]) & (rn[None, :] < n_tokens), s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + rn[:, None] * stride_v + kv_head * HEAD_DIM + rd[None, :], mask=valid, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + rm[:, None] * stride_o + head * HEAD_DIM + rd[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=rm[:, None] < n_tokens)


@lists_kernels(_tokens("k", "v"), output="x")
def context_attention(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one prompt: q ``x`` [M, heads, D], k and v [M, kv_heads, D] (v may be strided)."""
    n_tokens, heads, head_dim = x.shape
    out = torch.empty_like(x)
    grid = (triton.cdiv(n_tokens, 64), heads)
    _context_attention_kernel[grid](x, k, v, out, n_tokens, x.stride(0), k.stride(0), v.stride(0), out.stride(0),
                                    1.0 / math.sqrt(head_dim), GROUP=heads // k.shape[1], HEAD_DIM=head_dim,
                                    BLOCK_M=64, BLOCK_N=64)
    return out


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len_ptr, scale, GROUP: tl.constexpr,
                             KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    head = tl.program_id(0)
    kv_head = head // GROUP
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + head * HEAD_DIM + rd).to(tl.float32)
    seq_len = tl.load(seq_len_ptr)
    m_i = tl.full([BLOCK_N], -float("inf"), tl.float32)  # per lane, folded together at the end
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        valid = rn < seq_len
        offsets = (rn[:, None] * KV_HEADS + kv_head) * HEAD_DIM + rd[None, :]
        k = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * scale, -float("inf"))
        m_new = tl.maximum(m_i, s)
        alpha = tl.where(m_new == -float("inf"), 0.0, tl.exp(m_i - m_new))
        p = tl.where(valid, tl.exp(s - m_new), 0.0)
        v = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v
        m_i = m_new
    m = tl.max(m_i, 0)
    weight = tl.where(m_i == -float("inf"), 0.0, tl.exp(m_i - m))
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(l_i * weight, 0)
    tl.store(o_ptr + head * HEAD_DIM + rd, out.to(o_ptr.dtype.element_ty))


@lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x")
def decode_attention(x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seq_len: torch.Tensor) -> torch.Tensor:
    """One new token's attention: q ``x`` [1, heads, D] over the first ``seq_len`` (a 1-element int32 tensor, so
    the kernel does not specialize on it) entries of the caches [max_seq, kv_heads, D]."""
    _, heads, head_dim = x.shape
    kv_heads = k_cache.shape[1]
    out = torch.empty_like(x)
    _decode_attention_kernel[(heads,)](x, k_cache, v_cache, out, seq_len, 1.0 / math.sqrt(head_dim),
                                       GROUP=heads // kv_heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_N=64)
    return out
