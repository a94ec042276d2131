"""One node of the FlashInfer store tests, run as a process of its own (its own FLASHINFER_WORKSPACE_BASE; the build
store in BUILDOPS_STORE): lists silu_and_mul's module in a build pass, then makes the op's first real call the way
FlashInfer serves it (its module getter: build_and_load). Prints a JSON summary.

With the argument 'tamper', first changes the module's library on disk (appends a byte), as a corrupt local copy."""

import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

import flashinfer.activation
import torch
from flashinfer.jit.activation import gen_act_and_mul_module

import buildops
from buildops import build_pass, report

from flashinfer_ops import silu_and_mul

library = Path(gen_act_and_mul_module("silu").jit_library_path)
if sys.argv[1:] == ["tamper"]:
    library.write_bytes(library.read_bytes() + b"\0")

with build_pass("warmup"):
    silu_and_mul(torch.zeros(4, 256, dtype=torch.float16))
rep = report()
[record] = rep.builds
after_build = library.stat().st_mtime_ns
flashinfer.activation.get_act_and_mul_module("silu")  # the op's first call: FlashInfer's build_and_load
print(json.dumps({
    "buildops": buildops.__file__,
    "built": rep.total("built"),
    "origin": record.origin,
    "cached": record.cached,
    "store": asdict(rep.store) if rep.store else None,
    "coverage": rep.coverage()["flashinfer"].to_dict(),
    "late": [late.describe() for late in buildops.late_compiles()],
    "objects": sorted(p.name for p in library.parent.glob("*.o")),
    "library": hashlib.sha256(library.read_bytes()).hexdigest(),
    "first_call_left_library": library.stat().st_mtime_ns == after_build,
}), flush=True)
