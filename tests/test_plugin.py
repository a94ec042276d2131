"""buildops' pytest plugin, run through pytester: its fixtures, option and marker, its loading, and the examples of
docs/testing.md.

Runs in this process (``runpytest``) restore ``sys.modules`` after them, so they use only modules this one has
imported already (a module first imported inside one is imported again by the next, which torch's and Triton's
extensions do not survive); runs that compile with Triton run in a subprocess.
"""

import re
import textwrap
from pathlib import Path

import pytest

import buildops._core.ops  # the runs in this process use lists_kernels: imported before them
import buildops.pytest_plugin
from buildops import settings

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT = 300  # a pytest run that imports torch and compiles with Triton, on a busy machine


def test_pytest_loads_the_plugin_by_its_entry_point(request):
    assert request.config.pluginmanager.get_plugin("buildops") is buildops.pytest_plugin
    assert 'buildops = "buildops.pytest_plugin"' in (ROOT / "pyproject.toml").read_text()


def test_loading_the_plugin_imports_no_torch(pytester):
    pytester.makepyfile(test_light="""
        import sys

        def test_light(request):
            assert request.config.pluginmanager.has_plugin("buildops")
            heavy = sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "triton"))
            assert heavy == []
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=SUBPROCESS_TIMEOUT)
    result.assert_outcomes(passed=1)


def test_fresh_buildops_needs_no_import(pytester):
    pytester.makeconftest("""
        import pytest

        @pytest.fixture(autouse=True)
        def _fresh(fresh_buildops):
            yield
    """)
    pytester.makepyfile(test_fresh="""
        import buildops
        from buildops import Build
        from buildops._core.default import current_builder, default_builder

        def test_leaves_a_builder():
            default_builder().submit(Build("op", "key", lambda: None)).result(10)
            assert buildops.report().total("built") == 1

        def test_starts_without_one():
            assert current_builder() is None and buildops.report().total("built") == 0
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


OPS = """
    import torch
    from buildops import Build, BuildConfig, DynamicSpec, lists_kernels

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, max=64)), output="x")
    def norm(x):
        return x * 2

    @norm.lister
    def _(x):
        return [Build("norm", ("norm", x.shape[0], x.dtype), lambda: None)]
"""


def test_buildops_listings_records_what_the_test_lists(pytester):
    pytester.makepyfile(test_listings=OPS + """
    def test_records(buildops_listings):
        out = norm(torch.ones(100, 8))
        norm(torch.ones(7, 8))  # same call signature: listed once
        assert torch.equal(out, torch.zeros(100, 8))  # a placeholder: the op did not run
        assert [d["x.0"] for d in buildops_listings.dims("norm")] == [1, 2, 4, 8, 16, 32, 64, 100]
        assert buildops_listings.ops() == ["norm"] and len(buildops_listings.signatures("norm")) == 1

    def test_outside_the_fixture_the_op_runs():
        assert torch.equal(norm(torch.ones(3, 8)), torch.full((3, 8), 2.0))
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_option_sets_the_late_compile_setting_for_the_run(pytester):
    before = settings.late_compile
    pytester.makepyfile(test_mode=f"""
        from buildops import settings

        def test_mode(pytestconfig):
            assert settings.late_compile == (pytestconfig.getoption("buildops_late_compile") or {before!r})
    """)
    pytester.runpytest("-p", "no:cacheprovider", "--buildops-late-compile=ignore").assert_outcomes(passed=1)
    pytester.runpytest("-p", "no:cacheprovider", "--buildops-late-compile=error").assert_outcomes(passed=1)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)  # no option: left as it is
    assert settings.late_compile == before  # restored at the end of the run

    wrong = pytester.runpytest("-p", "no:cacheprovider", "--buildops-late-compile=loud")
    assert wrong.ret == pytest.ExitCode.USAGE_ERROR
    wrong.stderr.fnmatch_lines(["*--buildops-late-compile*invalid choice*loud*"])


def test_help_names_the_option_and_the_marker(pytester):
    pytester.runpytest("--help").stdout.fnmatch_lines(["*--buildops-late-compile=*"])
    pytester.runpytest("--markers").stdout.fnmatch_lines(["@pytest.mark.buildops_no_late_compiles:*"])


LATE = """
    import pytest
    import torch

    import buildops
    import triton_kernels as K


    @pytest.fixture(autouse=True)
    def _fresh(fresh_buildops, tmp_path_factory, monkeypatch):
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "triton-cache"))
        K.add_kernel.device_caches.clear()  # its variants compile again: late, after a pass


    def warm_up():
        with buildops.build_pass("warmup"):
            K.double_rows(torch.zeros(4, 8))


    @pytest.mark.buildops_no_late_compiles
    def test_compiles_late():
        warm_up()
        x = torch.zeros(64)
        K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=32)  # a kernel no op listed


    @pytest.mark.buildops_no_late_compiles
    def test_compiles_only_what_the_pass_built():
        warm_up()
        x = torch.zeros(16, 8)
        K.rows_kernel.warmup(x, x, 16, 8, grid=(1,), BLOCK_M=16, BLOCK_N=8)  # what double_rows listed at 16 rows
        assert buildops.late_compiles() == []


    def test_unmarked_compiles_late_and_passes():
        warm_up()
        x = torch.zeros(64)
        K.add_kernel.warmup(x, x, x, 16, grid=(1,), BLOCK=32)
        assert len(buildops.late_compiles()) == 1
"""


@pytest.fixture
def kernels_importable(monkeypatch):
    """The subprocess imports tests/triton_kernels.py."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))


def test_the_marker_fails_a_test_that_compiles_late(pytester, kernels_importable):
    pytester.makepyfile(test_late=LATE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=SUBPROCESS_TIMEOUT)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*test_compiles_late*",
        "*buildops_no_late_compiles: 1 kernel(s) compiled late (on first use after a build pass) during this test:",
        "*late compile of triton kernel triton_kernels.add_kernel (no op listed this kernel) at *test_late.py:*",
        "*List them in a build pass*",
    ])
    assert "test_compiles_only_what_the_pass_built FAILED" not in result.stdout.str()


def test_the_option_and_the_marker_together_fail_at_the_call(pytester, kernels_importable):
    pytester.makepyfile(test_late=LATE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--buildops-late-compile=error",
                                           "-k", "test_compiles_late or test_unmarked", timeout=SUBPROCESS_TIMEOUT)
    result.assert_outcomes(failed=2)  # LateCompileError raised into the warmup call, marked or not
    assert result.stdout.str().count("LateCompileError: late compile of triton kernel triton_kernels.add_kernel") >= 2


def _doc_examples() -> dict[str, str]:
    """The Python examples of docs/testing.md's plugin section, by the file name each one's first line gives."""
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text.split("## The pytest plugin", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        name = re.match(r"# (\S+\.py)\n", block)
        assert name, f"an example in the plugin section names no file in its first line:\n{block}"
        files[name.group(1)] = block
    return files


def test_the_docs_examples_run(pytester):
    examples = _doc_examples()
    assert set(examples) == {"my_ops.py", "conftest.py", "test_my_ops.py", "test_serving.py"}
    for name, source in examples.items():
        pytester.path.joinpath(name).write_text(textwrap.dedent(source))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=SUBPROCESS_TIMEOUT)
    import torch
    if torch.cuda.is_available():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["*launches kernels: needs a GPU*"])


def test_an_old_conftest_that_imports_the_fixture_still_works(pytester):
    pytester.makeconftest("""
        import pytest
        from buildops.testing import fresh_buildops  # noqa: F401

        @pytest.fixture(autouse=True)
        def _fresh(fresh_buildops):  # noqa: F811
            yield
    """)
    pytester.makepyfile(test_old="def test_old(): pass")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
