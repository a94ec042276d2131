import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_builds_real_kernels_and_reports(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--tokens", "64",
                             "--cache-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "BUILDOPS_THREADS": "2"})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.split()[:5] == ["matmul", "40", "30", "10", "0"] for line in lines), result.stdout
    assert "18 kernel(s) built" in result.stdout and "; 0 failed" in result.stdout
    assert len(list(tmp_path.rglob("*.cubin"))) == 18  # real artifacts, in Triton's own cache
