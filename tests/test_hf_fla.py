"""A transformers model made of fla-core's Triton ops, decorated from outside (``examples/hf_fla``): its wiring
against transformers' own Llama, what its rehearsal lists, and its rotary kernels' compiles. Its starts are
measured by ``benchmarks/real_start.py`` on a GPU."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import buildops
from buildops.testing import record_listings

pytest.importorskip("fla")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla, on a CPU

# fla picks its device from Triton's active driver as it is imported: imported before any test installs buildops'
# compile-only driver (a CPU machine has none), it sees no GPU, as it should here.
from examples.hf_fla import ops  # noqa: E402
from examples.hf_fla.engine import generate, load, make_trace, rehearse, warmup_shapes  # noqa: E402
from examples.hf_fla.model import SIZES, FlaAttention, FlaMLP, FlaRMSNorm, create_model, make_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = SIZES["small"]


def test_the_model_is_transformers_llama_with_fla_modules_and_the_same_weights():
    from transformers import LlamaForCausalLM

    model = create_model(SIZES["base"], "meta")
    with torch.device("meta"):
        stock = LlamaForCausalLM(SIZES["base"].hf_config())
    ours = {name: (p.shape, p.dtype) for name, p in model.named_parameters()}
    assert ours == {name: (p.shape, torch.bfloat16) for name, p in stock.named_parameters()}  # a checkpoint fits
    kinds = {type(m) for m in model.modules()}
    assert {FlaRMSNorm, FlaMLP, FlaAttention} <= kinds
    assert sum(p.numel() for p in model.parameters()) * 2 > 2.5e9  # a checkpoint of a few GB: its load takes seconds


def test_the_wiring_matches_transformers_own_llama(tmp_path):
    """With plain-torch stand-ins for fla's ops, the model computes what transformers' Llama does: the rotary
    tables, the flattened tokens, the KV cache's decode steps."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = create_model(SMALL, "cpu", ops.reference_ops())
    load(model, make_checkpoint(tmp_path / "small.safetensors", SMALL))  # through tiny_llm's loader
    stock = LlamaForCausalLM(SMALL.hf_config()).to(SMALL.dtype).eval()
    stock.load_state_dict(dict(model.named_parameters()))
    ids = torch.randint(SMALL.vocab, (2, 9))
    with torch.inference_mode():
        ours, theirs = model(input_ids=ids).logits.float(), stock(input_ids=ids).logits.float()
        torch.testing.assert_close(ours, theirs, atol=0.05 * theirs.abs().max().item(), rtol=0)
        assert torch.equal(generate(model, ids, 4), generate(stock, ids, 4))


def test_the_rehearsal_lists_every_fla_op_at_every_token_count_up_to_the_most():
    config = SIZES["base"]
    with record_listings() as rec:  # on meta tensors: the base model, allocated nowhere
        rehearse(create_model(config, "meta"), config)
    names = {op.op_name: op for op in (ops.rms_norm, ops.swiglu, ops.rotary)}
    assert sorted(rec.ops()) == sorted(names)
    powers = [2 ** i for i in range(15)]  # 1 ... 16384 = 8 x 2048 tokens, flattened
    assert sorted({d["x.0"] for d in rec.dims(ops.rms_norm.op_name)}) == powers
    assert sorted({d["x.1"] for d in rec.dims(ops.rotary.op_name)}) == powers
    for op in names:  # one call signature each: the layers' calls share it, the decode step too
        assert len(rec.signatures(op)) == 1
    kernels = {key[1].rpartition(".")[2] for key in set(rec.keys()) if key[0] == "triton"}
    # fla's own kernels, found in fla's code: the row norm (hidden 3072 > 512), and each autotuning config
    assert kernels == {"layer_norm_fwd_kernel_row", "swiglu_fwd_kernel", "rotary_embedding_kernel"}
    assert len(set(rec.keys(ops.rotary.op_name))) >= 15  # one per autotuning config, at least


def test_the_trace_is_seeded_and_spans_batches_and_prompts():
    config = SIZES["base"]
    trace = make_trace(config)
    assert trace == make_trace(config) and trace != make_trace(config, seed=1)
    assert 20 <= len(trace) <= 40
    assert {r.batch for r in trace} <= set(range(1, 9)) and len({r.batch for r in trace}) >= 5
    prompts = sorted(r.prompt for r in trace)
    assert prompts[0] <= 4 and prompts[-1] >= 1024 and len(set(prompts)) >= 16  # every scale, new sizes
    assert all(2 <= r.new_tokens <= 6 for r in trace)
    shapes = warmup_shapes(config)
    assert (1, 1) in shapes and (8, 2048) in shapes and (8, 1) in shapes


def test_the_rotary_kernels_compile_with_no_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    heads, dim = 4, 128
    x = torch.zeros(1, 1, heads, dim, dtype=torch.bfloat16)
    table = torch.zeros(64, dim // 2, dtype=torch.bfloat16)
    with buildops.build_pass("warmup"):
        ops.rotary(x, table, table)
    report = buildops.report()
    assert report.failures == () and report.total("built") >= 15  # fla's autotuning configs


@pytest.mark.gpu
def test_a_buildops_start_compiles_nothing_while_serving(tmp_path):
    """The small model's buildops start, with late compiles as errors: the trace compiles nothing."""
    checkpoint = tmp_path / "small.safetensors"
    environ = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "BUILDOPS_LATE_COMPILE": "error",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "examples.hf_fla", "--size", "small", "--checkpoint",
                           str(checkpoint), "--requests", "12"], cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["serving_compiles"] == 0 and result["late_compiles"] == 0
    assert result["build_failures"] == 0 and result["builds"] > 0
    assert result["tokens_repeat"]  # the warm replay gave the same tokens
