"""Inputs the command line once met with a traceback or a false success (issue 33, item 4): a report or manifest
nested 100,000 deep, one that is not UTF-8 or too large, and a bad BUILDOPS_STORE given to ``prebuild``. Each is
one line on stderr naming the file or the variable, exit 2."""

import pytest

from buildops._runtime import files
from buildops.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("command", ["report", "prebuild"])
def test_json_nested_too_deep_is_one_line_naming_the_file(tmp_path, capsys, command):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    status, out, err = run(capsys, command, str(path))
    assert (status, out) == (2, "") and err.count("\n") == 1, err
    assert str(path) in err and "nested too deep" in err


@pytest.mark.parametrize("command", ["report", "prebuild"])
def test_a_file_that_is_not_utf8_is_one_line_naming_the_file(tmp_path, capsys, command):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"format": "caf\xe9"}')
    status, out, err = run(capsys, command, str(path))
    assert (status, out) == (2, "") and err.count("\n") == 1, err
    assert str(path) in err and "not UTF-8" in err


@pytest.mark.parametrize("command", ["report", "prebuild"])
def test_a_file_larger_than_any_report_or_manifest_is_refused_unread(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 64)
    path = tmp_path / "big.json"
    path.write_text('{"format": "' + "x" * 100 + '"}')
    status, out, err = run(capsys, command, str(path))
    assert (status, out) == (2, "") and err.count("\n") == 1, err
    assert str(path) in err and "more than the 64" in err


@pytest.mark.parametrize("value", ["garbage", "redis://:hunter22@cache:notaport/0"])
def test_prebuild_with_a_bad_store_is_a_usage_error_naming_the_variable(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("BUILDOPS_STORE", value)
    path = tmp_path / "manifest.json"
    path.write_text('{"format": "buildops-manifest", "version": 1, "entries": []}')
    status, out, err = run(capsys, "prebuild", str(path))
    assert (status, out) == (2, "") and err.count("\n") == 1, err
    assert "BUILDOPS_STORE" in err and "hunter22" not in err
