"""Listing by replay on meta tensors: the shortcut for ``torch.empty_like`` (``buildops/_host_replay.py``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from buildops._core.listing import _MetaEmptyLike

ROOT = Path(__file__).resolve().parents[1]


def _strided(shape, stride, dtype=torch.float16):
    storage = torch.empty(1000, dtype=dtype)
    return storage.as_strided(shape, stride)


@pytest.mark.parametrize("like, kwargs", [
    (_strided((4, 8), (8, 1)), {}),
    (_strided((1, 8), (100, 1)), {}),  # contiguous, with an odd stride on its size-1 dim: the GPU keeps it
    (_strided((4, 8), (8, 1)), {"dtype": torch.float32}),
    (_strided((8, 4), (1, 8)), {}),  # transposed: torch's own meta kernel
    (_strided((4, 4), (8, 1)), {}),  # a slice, not dense: torch's own meta kernel
])
def test_empty_like_of_a_meta_tensor_is_what_a_real_tensor_gets(like, kwargs):
    meta = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device="meta")
    with _MetaEmptyLike():
        made = torch.empty_like(meta, **kwargs)
    real = torch.empty_like(like, **kwargs)
    assert (made.device.type, made.shape, made.stride(), made.dtype) == ("meta", real.shape, real.stride(),
                                                                         real.dtype)


REPLAY_IMPORTS = r"""
import sys
import torch
from examples.tiny_llm import kernels as K

x = torch.empty(64, 512, dtype=torch.bfloat16, device="meta")
weight = torch.empty(512, dtype=torch.bfloat16, device="meta")
builds = K.rmsnorm.builds_for(x, weight, 1e-6)  # its host code begins with torch.empty_like(x)
print(len(builds) > 0, "sympy" in sys.modules)
"""


def test_a_replay_on_meta_tensors_imports_no_sympy():
    """Torch's meta ``empty_like`` imports torch's symbolic shapes and sympy (1.8 s on the H200 host)."""
    pytest.importorskip("triton")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", REPLAY_IMPORTS], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False"]
