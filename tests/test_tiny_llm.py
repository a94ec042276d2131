"""The tiny LLM example (examples/tiny_llm) on the CPU: its kernels' math, what its startup lists and builds, and
its checkpoint. Its GPU startup is measured by benchmarks/startup.py."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import buildops
from buildops.testing import record_listings

pytest.importorskip("triton")
pytest.importorskip("safetensors")

from safetensors.torch import load_file

from examples.tiny_llm import kernels as K
from examples.tiny_llm.checkpoint import load_checkpoint, make_checkpoint
from examples.tiny_llm.family import TinyLlmGemms
from examples.tiny_llm.model import SIZES, TinyLlm

ROOT = Path(__file__).resolve().parents[1]
SMALL = SIZES["small"]


def small_model():
    model = TinyLlm(SMALL, "cpu")
    model.dummy_weights()
    return model


@pytest.mark.skipif(tuple(int(p) for p in __import__("triton").__version__.split(".")[:2]) < (3, 7),
                    reason="Triton 3.6's interpreter fails on the matmul (a TypeError inside the interpreter); "
                           "on a GPU, benchmarks/startup.py checks the compiled kernels against torch")
def test_kernels_match_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "tiny_llm_interpreted.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] < 1e-4
    assert result["tokens"] == result["reference"]  # prefill, then decode steps over the KV cache


def test_the_rehearsal_lists_every_kernel_at_odd_and_aligned_token_counts():
    with record_listings() as rec:
        small_model().rehearse()
    # by op_name: another module's matmul or rmsnorm, imported first, keeps the bare name
    assert set(rec.ops()) == {getattr(K, op).op_name for op in ("embedding", "rmsnorm", "add_rmsnorm", "matmul",
                                                                 "rope", "silu_mul", "context_attention",
                                                                 "decode_attention")}
    context_sizes = {d["x.0"] for d in rec.dims("context_attention")}
    assert {1, 3, 7, 15, 16, 31, 32, 63, 64} <= context_sizes  # both divisibility variants of every bucket
    keys = {b.key for op in rec.ops() for listing in rec.of(op) for b in listing.builds if b.library == "triton"}
    counts = {}
    for key in keys:
        counts[key[1].rsplit(".", 1)[-1]] = counts.get(key[1].rsplit(".", 1)[-1], 0) + 1
    # distinct kernel variants (Triton 3.7): the matmul gives 12 (configs x M buckets x M divisibility), the
    # context attention 3 (its token count: 1, a multiple of 16, neither), every other kernel 1
    assert counts == {"_matmul_kernel": 12, "_context_attention_kernel": 3, "_embedding_kernel": 1,
                      "_rmsnorm_kernel": 2, "_rope_kernel": 1, "_silu_mul_kernel": 1, "_decode_attention_kernel": 1}, \
        counts
    family = {b.key for b in TinyLlmGemms().builds(None, SMALL) if b.library == "triton"}
    assert family and family <= keys  # the family queues, from the config alone, GEMMs the rehearsal lists too


def test_a_build_pass_compiles_every_kernel_and_nothing_compiles_late(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    with buildops.build_pass("warmup"):
        small_model().rehearse()
    report = buildops.report()
    assert report.total("failed") == 0 and report.coverage()["triton"] == (21, 0)


def test_the_family_queues_from_the_configuration_before_the_model_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    family = buildops.register_family(TinyLlmGemms())
    try:
        with buildops.build_pass("warmup"):
            queued = buildops.model_configured(SMALL)
            model = small_model()
            assert buildops.model_created(model, SMALL) == queued  # the same builds: nothing new is queued
            model.rehearse()
    finally:
        buildops.unregister_family(family)
    report = buildops.report()
    matmul = next(op for op in report.ops if op.op == K.matmul.op_name)  # the family lists through the op itself
    assert queued and report.total("failed") == 0
    # model_created listed them again and the rehearsal listed them too: both found them queued
    assert matmul.shared >= 2 * len(queued)
    assert report.coverage()["triton"] == (21, 0)  # each kernel variant built once, as without the family


def test_checkpoint_round_trip_and_a_clear_error_for_another_size(tmp_path):
    path = make_checkpoint(tmp_path / "small.safetensors", SMALL)
    model = TinyLlm(SMALL, "cpu")
    assert load_checkpoint(model, path) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert torch.equal(model.norm, torch.ones_like(model.norm)) and model.embed.float().std() > 0.5
    saved = load_file(path)  # safetensors' own reader: this loader parses the header itself
    assert all(torch.equal(param, saved[name]) for name, param in model.named_parameters())
    assert not list(tmp_path.glob("*.partial"))
    other = TinyLlm(dataclasses.replace(SMALL, hidden=256), "cpu")
    with pytest.raises(ValueError, match="embed is torch.bfloat16 .* wants .* another size"):
        load_checkpoint(other, path)


def test_a_damaged_checkpoint_header_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.safetensors: not a safetensors file, or its header is damaged"):
        load_checkpoint(TinyLlm(SMALL, "cpu"), empty)
    header = json.dumps({"embed": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 6]}}).encode()
    short = tmp_path / "short.safetensors"
    short.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(ValueError, match=r"embed \(BF16 \(2, 2\)\) spans 6 bytes in the file, not 8"):
        load_checkpoint(TinyLlm(SMALL, "cpu"), short)
    cut = make_checkpoint(tmp_path / "cut.safetensors", SMALL)
    cut.write_bytes(cut.read_bytes()[:-3])  # a copy that stopped early: a clear error, not weights with a stale tail
    with pytest.raises(ValueError, match="cut.safetensors: the file ends early"):
        load_checkpoint(TinyLlm(SMALL, "cpu"), cut)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the pinned, chunked copy path")
def test_the_chunked_gpu_load_matches_safetensors(tmp_path, monkeypatch):
    from examples.tiny_llm import checkpoint

    monkeypatch.setattr(checkpoint._ChunkedCopy, "CHUNK", 1000)  # tensors span chunks, buffers are reused
    path = make_checkpoint(tmp_path / "small.safetensors", SMALL)
    model = TinyLlm(SMALL, "cuda")
    torch.cuda._sleep(200_000_000)  # the default stream is busy for a while, so the dummy weights' fill is queued
    model.dummy_weights()  # behind it when the load begins: the load must not be overwritten by it
    load_checkpoint(model, path)
    saved = load_file(path)
    assert all(torch.equal(param.cpu(), saved[name]) for name, param in model.named_parameters())


def test_a_buildops_start_ends_with_a_warm_request_unless_told_not_to(capsys):
    from examples.tiny_llm.__main__ import parse_args

    assert parse_args([]).warm_request is True
    assert parse_args(["--no-warm-request"]).warm_request is False
    assert parse_args(["--start", "lazy"]).warm_request is False  # a step of the buildops start only
    with pytest.raises(SystemExit):
        parse_args(["--start", "warmup", "--warm-request"])
    assert "--warm-request is a step of the buildops start" in capsys.readouterr().err
