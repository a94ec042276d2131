import json
import subprocess
import sys

import buildops

PROBE = r"""
import json, os, sys, threading
import torch, wrapt, filelock  # buildops' own dependencies may read what they like

reads = []
class Recording(type(os.environ)):
    def __getitem__(self, key):
        reads.append(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        reads.append(key)
        return super().__contains__(key)
    def get(self, key, default=None):
        reads.append(key)
        return super().get(key, default)

os.environ = Recording(os.environ._data, os.environ.encodekey, os.environ.decodekey,
                       os.environ.encodevalue, os.environ.decodevalue)
threads = threading.active_count()
import buildops, buildops.testing, buildops.reporting
print(json.dumps({"reads": reads, "threads": threading.active_count() - threads,
                  "optional": sorted(m for m in ("triton", "flashinfer", "deep_gemm") if m in sys.modules)}))
"""


def test_import_starts_no_thread_and_reads_no_environment():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.splitlines()[-1])
    assert probe == {"reads": [], "threads": 0, "optional": []}


def test_every_public_name_resolves():
    assert buildops.__all__ == sorted(buildops.__all__)
    for name in buildops.__all__:
        assert getattr(buildops, name) is not None, name
    import buildops.testing as testing
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name
