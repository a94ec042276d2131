"""Run in a child with TRITON_INTERPRET=1 (by tests/test_tiny_llm.py): the example's kernels on the CPU, in fp32,
against the torch reference; prints the relative logit error and both greedy token lists."""

import dataclasses
import json

import torch

import examples.tiny_llm.kernels as K
from examples.tiny_llm.model import SIZES, TinyLlm, reference_logits

K._matmul_kernel.do_bench = lambda fn, quantiles: (fn(), [1.0, 1.0, 1.0])[1]  # nothing to time in the interpreter
config = dataclasses.replace(SIZES["small"], dtype=torch.float32)
model = TinyLlm(config, "cpu")
generator = torch.Generator().manual_seed(0)
with torch.no_grad():
    for name, param in model.named_parameters():
        std = 1.0 if name == "embed" else param.shape[0] ** -0.5
        values = torch.ones(param.shape) if param.dim() == 1 else torch.randn(param.shape, generator=generator) * std
        param.copy_(values)
prompt = torch.randint(config.vocab, (23,), generator=generator, dtype=torch.int32)
expected = reference_logits(model, prompt)
error = ((model(prompt, 0) - expected).abs().max() / expected.abs().max()).item()
sequence, reference_tokens = prompt.tolist(), []
for _ in range(4):
    reference_tokens.append(int(reference_logits(model, torch.tensor(sequence, dtype=torch.int32)).argmax()))
    sequence.append(reference_tokens[-1])
print(json.dumps({"error": error, "tokens": model.generate(prompt.tolist(), 4), "reference": reference_tokens}))
