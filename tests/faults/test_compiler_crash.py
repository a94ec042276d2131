"""A compiler that crashes (a ptxas killed by SIGSEGV) fails its build cleanly: the pass ends, the report names
the kernel, the op is left to compile on first use, and nothing is left running, under either executor."""

import os
import subprocess
import sys
import uuid

import pytest
from test_orphans import EXIT_WITHIN, SCRIPT, _alive_with, _kill

# Answers --version as Triton's own ptxas; dies by SIGSEGV on the marked kernel, runs the real one otherwise.
CRASHING_PTXAS = r"""#!/bin/bash
if [ "$1" = "--version" ]; then
    printf '%s\n' "ptxas: NVIDIA (R) Ptx optimizing assembler" "Copyright (c) 2005-2025 NVIDIA Corporation" \
        "Built on Fri_Feb_21_20:21:21_PST_2025" "Cuda compilation tools, release 12.8, V12.8.93" \
        "Build cuda_12.8.r12.8/compiler.35583870_0"
    exit 0
fi
for arg in "$@"; do
    if [ -f "$arg" ] && grep -q orphan_marker "$arg"; then
        kill -SEGV $$
    fi
done
exec "__REAL__" "$@"
"""

# The hung-compiler script's program, its report's failure printed too.
REPORTING = SCRIPT.replace('    print("failed", buildops.report().total("failed"), flush=True)\n',
                           '    print("failed", buildops.report().total("failed"), flush=True)\n'
                           '    print("failure", *buildops.report().failures[0][1:], flush=True)\n')


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_a_crashing_compiler_fails_its_build_and_names_the_kernel(tmp_path, executor):
    triton = pytest.importorskip("triton")
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.access(real, os.X_OK):
        pytest.skip("Triton without its ptxas")
    assert REPORTING != SCRIPT  # the script still prints what it is told to
    mark = f"buildops-crash-{uuid.uuid4().hex}"
    ptxas = tmp_path / f"ptxas-{mark}"
    ptxas.write_text(CRASHING_PTXAS.replace("__REAL__", real))
    ptxas.chmod(0o755)
    script = tmp_path / "crashing_compiler.py"
    script.write_text(REPORTING)
    env = dict(os.environ, BUILDOPS_EXECUTOR=executor, BUILDOPS_THREADS="1", BUILDOPS_BUILD_TIMEOUT="60",
               TRITON_PTXAS_PATH=str(ptxas), ORPHAN_MARK=mark, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                              timeout=EXIT_WITHIN, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "failed 1" in done.stdout, (done.stdout, done.stderr[-3000:])
        [failure] = [line for line in done.stdout.splitlines() if line.startswith("failure")]
        assert "orphan_marker" in failure, failure  # the build, named by its kernel
        assert "compile it on first use" in done.stderr, done.stderr[-3000:]
        assert _alive_with([mark]) == []
    finally:
        _kill(_alive_with([mark]))
