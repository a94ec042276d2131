"""A stand-in for ``deep_gemm`` with its public signatures: it checks operand shapes and dtypes as DeepGEMM
would need them and appends one line per call to the file named by ``FAKE_DEEP_GEMM_LOG`` (so that calls made in
worker processes are seen), optionally holding the GIL for ``FAKE_DEEP_GEMM_GIL_SECONDS`` like DeepGEMM's
binding does while it compiles."""

import ctypes
import json
import os

import torch

_libc = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL, like a C++ binding that never releases it


def _record(name, **fields):
    seconds = float(os.environ.get("FAKE_DEEP_GEMM_GIL_SECONDS", "0"))
    if seconds:
        _libc.usleep(int(seconds * 1e6))
    with open(os.environ["FAKE_DEEP_GEMM_LOG"], "a") as log:
        log.write(json.dumps({"fn": name, "pid": os.getpid(), **fields}) + "\n")


def _check(a, b, d):
    assert a[0].dtype == torch.float8_e4m3fn and b[0].dtype == torch.float8_e4m3fn, "operands must be fp8"
    assert a[1].dtype == torch.float32 and b[1].dtype == torch.float32, "scales must be fp32"
    assert d.dtype == torch.bfloat16, "output must be bf16"
    assert a[0].shape[-1] == b[0].shape[-1], "K must match"


def fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False):
    _check(a, b, d)
    assert d.shape == (a[0].shape[0], b[0].shape[0])
    _record("fp8_gemm_nt", m=a[0].shape[0], n=b[0].shape[0], k=b[0].shape[1])


def m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, recipe=None, compiled_dims="nk",
                                     disable_ue8m0_cast=False):
    _check(a, b, d)
    assert m_indices.shape == (a[0].shape[0],) and int(m_indices.max()) < b[0].shape[0]
    assert a[0].shape[0] % 128 == 0, "contiguous layout rows come in blocks of 128"
    _record("m_grouped_fp8_gemm_nt_contiguous", m=a[0].shape[0], e=b[0].shape[0], n=b[0].shape[1],
            k=b[0].shape[2])


def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, compiled_dims="nk",
                                 disable_ue8m0_cast=False):
    _check(a, b, d)
    assert masked_m.shape == (b[0].shape[0],) and a[0].shape[0] == b[0].shape[0]
    _record("m_grouped_fp8_gemm_nt_masked", m=expected_m, e=b[0].shape[0], n=b[0].shape[1], k=b[0].shape[2])
