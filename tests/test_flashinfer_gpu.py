"""FlashInfer's GPU path end to end, as an engine uses it: a build pass replays its attention wrappers' plans, after
which serving compiles nothing and matches a plain-torch reference. The reference itself is checked on the CPU."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import buildops

from paged_attention import PREFILL, AttentionConfig, paged_batch, random_requests, read_kv, reference, write_kv


def test_the_reference_reads_back_the_paged_kv_and_matches_dense_attention():
    config = AttentionConfig()
    batch = paged_batch(PREFILL, config.page_size)
    q, keys, values = random_requests(batch, config, dtype=torch.float32)
    cache = write_kv(batch, keys, values)
    used = sorted(batch.kv_indices.tolist())
    assert len(used) == batch.num_pages - 1 == len(set(used))  # no page shared, one page free
    assert batch.kv_indices.tolist() != used  # and a request's pages are not in cache order
    assert batch.kv_last_page_len.tolist() == [4, 13, 6] and batch.qo_indptr.tolist() == [0, 100, 117, 187]
    out = reference(q, cache, batch)
    for request, (start, qo, kv) in enumerate(zip(batch.qo_indptr.tolist(), batch.qo_lens, batch.kv_lens)):
        k, v = read_kv(cache, batch, request)
        assert torch.equal(k, keys[request]) and torch.equal(v, values[request])
        dense = F.scaled_dot_product_attention(  # heads first; query head h reads KV head h // (32 // 8)
            q[start:start + qo].transpose(0, 1), keys[request].transpose(0, 1), values[request].transpose(0, 1),
            attn_mask=torch.ones(qo, kv, dtype=torch.bool).tril(kv - qo), enable_gqa=True).transpose(0, 1)
        torch.testing.assert_close(out[start:start + qo], dense, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                    reason="FlashInfer is an optional dependency (./scripts/test installs it)")
def test_a_pass_replaying_both_plans_leaves_serving_nothing_to_compile(tmp_path):
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "flashinfer")}
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("flashinfer_serving.py"))], env=env,
                           capture_output=True, text=True, timeout=1500)
    assert child.returncode == 0, child.stderr[-6000:]
    result = json.loads(child.stdout.splitlines()[-1])
    assert result["buildops"] == buildops.__file__  # the buildops under test, not another install
    assert Path(result["workspace"]).is_relative_to(tmp_path) and result["workspace_was_empty"]
    report = result["report"]
    print(f"the pass built {result['libraries']} in {result['pass_seconds']:.1f} s "
          f"(builds' own time {report['totals']['build_seconds']:.1f} s)")

    # the pass built one prefill and one decode module, one ninja run each, and nothing failed
    decode, prefill = result["libraries"]
    assert decode.startswith("batch_decode_") and prefill.startswith("batch_prefill_"), result["libraries"]
    assert result["ninja"]["pass"] == 2 and report["totals"]["built"] == 2 and report["failures"] == []
    # serving's plans and runs compiled nothing: no ninja, no object or library added or rewritten, no late compile
    assert result["ninja"]["serving"] == [] and result["changed_while_serving"] == []
    assert result["late"] == [] and report["coverage"]["flashinfer"]["late"] == 0
    # and their outputs are the reference's, to bf16's precision
    assert result["errors"]["prefill"] <= 2e-2 and result["errors"]["decode"] <= 2e-2, result["errors"]
