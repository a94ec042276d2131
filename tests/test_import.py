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
    import buildops.backends.deep_gemm
    import buildops.backends.flashinfer
    import buildops.backends.triton
    import buildops.backends.variants
    import buildops.capture
    import buildops.reporting
    import buildops.startup
    import buildops.testing

    modules = (buildops, buildops.testing, buildops.startup, buildops.capture, buildops.reporting,
               buildops.backends.triton, buildops.backends.flashinfer, buildops.backends.deep_gemm,
               buildops.backends.variants)
    for module in modules:
        assert module.__all__ == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_no_public_name_hides_a_module():
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(buildops.__path__, "buildops."):
        parent, _, leaf = info.name.rpartition(".")
        value = getattr(importlib.import_module(parent), leaf, None)
        if value is not None:
            assert isinstance(value, type(buildops)), f"{info.name} is hidden by {value!r}"


def test_the_version_is_the_distributions():
    """pyproject.toml takes the version from ``buildops/_version.py``; an installed distribution reports it."""
    import pathlib
    import re
    from importlib.metadata import PackageNotFoundError, version

    pyproject = (pathlib.Path(buildops.__file__).parents[1] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = { attr = "buildops._version.__version__" }' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+", buildops.__version__)
    try:
        installed = version("buildops")
    except PackageNotFoundError:  # run from a source tree on PYTHONPATH (the GPU host): nothing else to compare
        return
    assert installed == buildops.__version__


def test_the_types_public_functions_return_are_exported():
    import typing

    import buildops.testing as testing

    assert typing.get_type_hints(buildops.report)["return"] is buildops.Report
    assert buildops.Report.__dataclass_fields__["ops"].type == "tuple[OpReport, ...]" and buildops.OpReport
    assert typing.get_type_hints(buildops.build_pass)["return"] is buildops.BuildPass
    assert typing.get_type_hints(testing.record_listings)["return"] is testing.ListingRecorder
