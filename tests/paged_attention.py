"""A small paged-attention engine over FlashInfer's prefill and decode wrappers, driven as a serving engine drives
them, with its op family (which replays the wrappers' plans in a build pass) and a plain-torch reference for its
outputs. tests/flashinfer_serving.py runs it on a GPU; the CPU tests check the reference and the plans' lookups.

Imports FlashInfer only when an engine is made: the reference needs torch alone."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from buildops.backends.variants import variants

# The serving batches, as (query tokens, KV tokens) per request. The prefill has a fresh prompt and an append (a
# later chunk of a longer prompt); its longest query is over 64 tokens, as is the replay's, because FlashInfer on
# SM90 picks fa2 for a batch whose queries are all 64 tokens or shorter and fa3 above that: another module.
PREFILL = ((100, 100), (17, 45), (70, 70))
DECODE = tuple((1, kv) for kv in (1, 16, 33, 200))  # a single token, a full last page, a longer cache
FREE_SLOT = 100.0  # what the cache holds where no request's KV is: no real key comes near it


@dataclass(frozen=True)
class AttentionConfig:
    qo_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    dtype: torch.dtype = torch.bfloat16
    replay_tokens: int = 128  # the prompt of the replay's dummy prefill


@dataclass(frozen=True)
class PagedBatch:
    """Requests over a paged KV cache: each request's query and KV token counts and its pages, in order."""

    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    pages: tuple[tuple[int, ...], ...]
    page_size: int
    num_pages: int

    @property
    def qo_indptr(self) -> torch.Tensor:
        return _indptr(self.qo_lens)

    @property
    def kv_indptr(self) -> torch.Tensor:
        return _indptr([len(pages) for pages in self.pages])

    @property
    def kv_indices(self) -> torch.Tensor:
        return torch.tensor([page for pages in self.pages for page in pages], dtype=torch.int32)

    @property
    def kv_last_page_len(self) -> torch.Tensor:
        return torch.tensor([kv - (len(pages) - 1) * self.page_size for kv, pages in zip(self.kv_lens, self.pages)],
                            dtype=torch.int32)


def _indptr(counts) -> torch.Tensor:
    return torch.tensor([0, *counts], dtype=torch.int32).cumsum(0, dtype=torch.int32)


def paged_batch(requests, page_size: int, seed: int = 0) -> PagedBatch:
    """A batch of ``(query tokens, KV tokens)`` requests whose pages are scattered over the cache in a random order,
    with one page that no request uses (a cache read in request order, or past a request's pages, reads wrong)."""
    qo_lens, kv_lens = zip(*requests)
    counts = [-(-kv // page_size) for kv in kv_lens]
    order = torch.randperm(sum(counts) + 1, generator=torch.Generator().manual_seed(seed)).tolist()
    starts = _indptr(counts).tolist()
    pages = tuple(tuple(order[start:start + count]) for start, count in zip(starts, counts))
    return PagedBatch(qo_lens, kv_lens, pages, page_size, len(order))


def random_requests(batch: PagedBatch, config: AttentionConfig, dtype: torch.dtype | None = None, seed: int = 0):
    """Values ~N(0, 1), on the CPU: the queries (``[query tokens, qo_heads, head_dim]``, the requests' rows in
    order) and each request's keys and values (``[kv tokens, kv_heads, head_dim]`` each)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype or config.dtype)

    q = randn(sum(batch.qo_lens), config.qo_heads, config.head_dim)
    keys = [randn(kv, config.kv_heads, config.head_dim) for kv in batch.kv_lens]
    values = [randn(kv, config.kv_heads, config.head_dim) for kv in batch.kv_lens]
    return q, keys, values


def write_kv(batch: PagedBatch, keys, values) -> torch.Tensor:
    """The NHD cache ``[pages, 2, page_size, kv_heads, head_dim]`` holding request r's ``keys[r]`` and
    ``values[r]`` (``[kv tokens, kv_heads, head_dim]`` each) in its pages, and ``FREE_SLOT`` everywhere else."""
    heads, dim = keys[0].shape[1:]
    cache = torch.full((batch.num_pages, 2, batch.page_size, heads, dim), FREE_SLOT, dtype=keys[0].dtype)
    for pages, k, v in zip(batch.pages, keys, values):
        tokens = torch.full((len(pages) * batch.page_size, 2, heads, dim), FREE_SLOT, dtype=k.dtype)
        tokens[:len(k), 0], tokens[:len(v), 1] = k, v
        cache[list(pages)] = tokens.view(len(pages), batch.page_size, 2, heads, dim).transpose(1, 2)
    return cache


def random_batch(requests, config: AttentionConfig, seed: int = 0) -> tuple[PagedBatch, torch.Tensor, torch.Tensor]:
    """A batch of ``(query tokens, KV tokens)`` requests, its queries and its KV cache, on the CPU."""
    batch = paged_batch(requests, config.page_size, seed)
    q, keys, values = random_requests(batch, config, seed=seed)
    return batch, q, write_kv(batch, keys, values)


def read_kv(cache: torch.Tensor, batch: PagedBatch, request: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request ``request``'s keys and values, gathered from its pages: ``[kv tokens, kv_heads, head_dim]`` each."""
    kv = cache[list(batch.pages[request])]
    tokens = batch.kv_lens[request]
    return tuple(kv[:, side].reshape(-1, *kv.shape[-2:])[:tokens] for side in (0, 1))


def reference(q: torch.Tensor, cache: torch.Tensor, batch: PagedBatch) -> torch.Tensor:
    """Causal attention in float32 of ``q`` (``[query tokens, qo_heads, head_dim]``, the requests' rows in order)
    over each request's KV, as FlashInfer defines it: a request's queries are its last tokens, so its last query
    sees every key (the causal mask is aligned bottom-right); each KV head serves a group of consecutive query
    heads."""
    out = []
    for request, (start, qo, kv) in enumerate(zip(batch.qo_indptr.tolist(), batch.qo_lens, batch.kv_lens)):
        k, v = (t.float().repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in read_kv(cache, batch, request))
        scores = torch.einsum("qhd,khd->hqk", q[start:start + qo].float(), k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~torch.ones(qo, kv, dtype=torch.bool).tril(kv - qo), -math.inf)
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.cat(out)


class PagedAttention:
    """An engine's attention: one prefill and one decode wrapper sharing one workspace, planned per batch."""

    def __init__(self, config: AttentionConfig, device) -> None:
        import flashinfer

        self.config = config
        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")

    def plan_prefill(self, batch: PagedBatch) -> None:
        c = self.config
        self.prefill.plan(batch.qo_indptr, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, c.qo_heads,
                          c.kv_heads, c.head_dim, c.page_size, causal=True, q_data_type=c.dtype,
                          kv_data_type=c.dtype)

    def plan_decode(self, batch: PagedBatch) -> None:
        c = self.config
        self.decode.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, c.qo_heads, c.kv_heads,
                         c.head_dim, c.page_size, q_data_type=c.dtype, kv_data_type=c.dtype)


class AttentionPlans:
    """The engine's op family: replays its wrappers' plans on dummy batches, which records the modules the plans
    look up as builds (buildops.backends.variants). The dummy batches need no KV cache: a plan reads only the page
    table."""

    name = "paged_attention"

    def recognizes(self, model, config) -> bool:
        return isinstance(model, PagedAttention)

    def builds(self, model: PagedAttention, config):
        from buildops.backends.flashinfer import PLAN_LOOKUPS

        tokens = model.config.replay_tokens
        with variants("prefill", *PLAN_LOOKUPS) as prefill:
            model.plan_prefill(paged_batch([(tokens, tokens)], model.config.page_size))
        with variants("decode", *PLAN_LOOKUPS) as decode:
            model.plan_decode(paged_batch([(1, tokens)], model.config.page_size))
        return prefill + decode
