"""A stand-in for ``deep_gemm`` with its public signatures: it checks operand shapes and dtypes as DeepGEMM
would need them and appends one line per call to the file named by ``FAKE_DEEP_GEMM_LOG`` (so that calls made in
worker processes are seen), optionally holding the GIL for ``FAKE_DEEP_GEMM_GIL_SECONDS`` like DeepGEMM's
binding does while it compiles. With ``DG_JIT_CACHE_DIR`` set, it keeps a cache laid out as DeepGEMM's is: a call
whose kernel has no ``cache/kernel.<name>.<hash>/`` entry "compiles" one (made in ``tmp/`` and renamed into
place, with ``kernel.cu`` and ``kernel.cubin``); its log line says whether it compiled."""

import ctypes
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import torch

_libc = ctypes.PyDLL(None)  # PyDLL: calls keep the GIL, like a C++ binding that never releases it


def _compile(name, fields):
    """True if the kernel of this call compiled into DeepGEMM's cache, False if it was there, None without one."""
    root = os.environ.get("DG_JIT_CACHE_DIR")
    if not root:
        return None
    digest = hashlib.sha256(json.dumps([name, sorted(fields.items())]).encode()).hexdigest()[:32]
    final = Path(root) / "cache" / f"kernel.{name}.{digest}"
    if (final / "kernel.cubin").exists():
        return False
    staging = Path(root) / "tmp" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    (staging / "kernel.cu").write_text(f"// {name} {fields}\n")
    (staging / "kernel.cubin").write_bytes(b"\x7fELF" + digest.encode())
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, final)
    except OSError:  # another process made it meanwhile
        shutil.rmtree(staging)
    return True


def _record(name, **fields):
    seconds = float(os.environ.get("FAKE_DEEP_GEMM_GIL_SECONDS", "0"))
    if seconds:
        _libc.usleep(int(seconds * 1e6))
    fields["compiled"] = _compile(name, fields)
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
