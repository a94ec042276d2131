"""A benchmark's start in a fresh process: ``SCRIPT --child ARM``, run with the repository first on PYTHONPATH, whose
last line of output is its result as JSON."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_child(script: str, arm: str, **env: str) -> dict:
    """The result of ``script --child arm`` in a fresh process, with ``env`` added to this one's environment;
    exits, with the end of its stderr, where it fails."""
    path = os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    done = subprocess.run([sys.executable, script, "--child", arm], env={**os.environ, **env, "PYTHONPATH": path},
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
