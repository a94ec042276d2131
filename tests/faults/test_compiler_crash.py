"""A compiler that crashes (a ptxas killed by SIGSEGV) fails its build cleanly: the pass ends, the report names
the kernel, the op is left to compile on first use, and nothing is left running, under either executor."""

import subprocess
import sys

import pytest
from test_orphans import EXIT_WITHIN, SCRIPT, _alive_with, _kill, fake_ptxas, script_env

# The hung-compiler script's program, its report's failure printed too.
REPORTING = SCRIPT.replace('    print("failed", buildops.report().total("failed"), flush=True)\n',
                           '    print("failed", buildops.report().total("failed"), flush=True)\n'
                           '    print("failure", *buildops.report().failures[0][1:], flush=True)\n')


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_a_crashing_compiler_fails_its_build_and_names_the_kernel(tmp_path, executor):
    assert REPORTING != SCRIPT  # the script still prints what it is told to
    ptxas, mark = fake_ptxas(tmp_path, "kill -SEGV $$", prefix="buildops-crash")
    script = tmp_path / "crashing_compiler.py"
    script.write_text(REPORTING)
    env = script_env(tmp_path, ptxas, mark, executor, "60")
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
