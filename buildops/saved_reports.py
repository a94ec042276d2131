"""A saved report read back (:func:`load_report`): every part checked against what :meth:`buildops.Report.to_dict`
writes, so that ``buildops report`` and tools reading reports get exactly the documented keys and types, or an
error naming the file and what is wrong."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ._runtime.files import read_json

__all__ = ["FORMAT", "OP_FIGURES", "VERSION", "load_report"]

# What a saved report says it is; a reader refuses any other format, or a version it does not know.
FORMAT = "buildops-report"
VERSION = 1

# The OpReport fields that are figures, in the table's order.
OP_FIGURES = ("listed", "shared", "built", "failed", "cancelled", "pending", "build_seconds", "wait_seconds")

# What load_report checks in each part of a saved report: the keys of each entry and their types. A float field
# takes an integer too (a hand-written 2 for 2.0), and is read as a float.
_COUNTS: dict[str, type] = {**dict.fromkeys(OP_FIGURES[:6], int), **dict.fromkeys(OP_FIGURES[6:], float)}
_ENTRIES: dict[str, dict[str, type]] = {
    "ops": {"op": str, **_COUNTS},
    "failures": {"op": str, "build": str, "error": str},
    "late": {"library": str, "kernel": str, "variant": str, "ops": list, "where": str},
    "listed_nothing": {"op": str, "pass_name": str, "signatures": int},
}
_SWEPT = {"op": str, "dim": str, "low": int, "high": int, "values": int}
_BEYOND = {"op": str, "dims": dict, "maxima": dict}
_COVERAGE = {"prebuilt": int, "late": int, "compiled": int, "cached": int, "unknown": int, "skipped": dict,
             "elsewhere": dict}
# The StoreCounts fields but ``failed`` (a string or null, checked on its own).
_STORE = {"store": str, "fetched": int, "fetched_bytes": int, "fetch_seconds": float, "stored": int,
          "stored_bytes": int, "known_locally": int, "waited_for_others": int, "built_after_others": int, "bad": int}


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A report saved by :meth:`Report.save`, as the dict :meth:`Report.to_dict` made, with exactly the keys it
    documents (others are dropped) and float fields as floats. ``store`` is optional (null where absent) and
    ``manifest`` is kept where present.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is not JSON, not a buildops report, of another version, or lacks a key or has one of
            the wrong type; the message names the file and what is wrong.
    """
    data = read_json(path, "buildops report")
    try:
        return _checked(data)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _checked(data: object) -> dict[str, Any]:
    """``data`` as a version-1 report dict, or a ValueError saying what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a buildops report (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ValueError(f"a buildops report of version {data.get('version')!r}; this buildops reads version "
                         f"{VERSION}")
    entries = {key: [_entry(item, fields, f"{key}[{i}]") for i, item in enumerate(_field(data, key, list))]
               for key, fields in _ENTRIES.items()}
    for i, late in enumerate(entries["late"]):
        if not all(isinstance(op, str) for op in late["ops"]):
            raise ValueError(f"late[{i}]: 'ops' is {late['ops']!r}, not a list of op names")
        # a report saved before late tunings were kept holds late compiles only
        late["kind"] = _field(data["late"][i], "kind", str, f"late[{i}]") if "kind" in data["late"][i] else "compile"
    coverage = {library: _entry(counts, _COVERAGE, f"coverage[{library!r}]")
                for library, counts in _field(data, "coverage", dict).items()}
    checked = {"format": FORMAT, "version": VERSION, "buildops": _field(data, "buildops", str),
               "ops": entries["ops"], "totals": _entry(_field(data, "totals", dict), _COUNTS, "totals"),
               "failures": entries["failures"], "coverage": coverage, "late": entries["late"],
               "listed_nothing": entries["listed_nothing"], "store": _checked_store(data.get("store")),
               "tunings": _checked_tunings(data.get("tunings")),
               # reports saved before these were kept lack them
               "swept": [_entry(e, _SWEPT, f"swept[{i}]") for i, e in enumerate(_optional_list(data, "swept"))],
               "beyond_max": [_entry(e, _BEYOND, f"beyond_max[{i}]")
                              for i, e in enumerate(_optional_list(data, "beyond_max"))]}
    if "manifest" in data:
        checked["manifest"] = _checked_manifest(_field(data, "manifest", list))
    return checked


def _optional_list(data: Mapping[str, Any], key: str) -> list[Any]:
    return _field(data, key, list) if key in data else []


def _checked_tunings(tunings: object) -> dict[str, int | None] | None:
    """A report's tunings (null in a report saved before they were counted)."""
    if tunings is None:
        return None
    if not isinstance(tunings, dict) or not isinstance(tunings.get("built"), int) or any(
            tunings.get(key) is not None and not isinstance(tunings.get(key), int)
            for key in ("before_ready", "after_ready")):
        raise ValueError(f"'tunings' is {tunings!r}, not {{\"built\": int, \"before_ready\": int or null, "
                         f"\"after_ready\": int or null}}")
    return {"built": tunings["built"], "before_ready": tunings.get("before_ready"),
            "after_ready": tunings.get("after_ready")}


def _checked_manifest(entries: list[Any]) -> list[dict[str, Any]]:
    """A report's manifest entries, each an object (what one holds is :mod:`buildops.manifests`' to check)."""
    for i, item in enumerate(entries):
        if not isinstance(item, dict):
            raise ValueError(f"manifest[{i}] is {item!r}, not an object")
    return entries


def _checked_store(store: object) -> dict[str, Any] | None:
    """A report's ``store`` counts, checked; None where the report has none (one saved before it had them)."""
    if store is None:
        return None
    counts = _entry(store, _STORE, "store")
    failed = store.get("failed") if isinstance(store, dict) else None
    if failed is not None and not isinstance(failed, str):
        raise ValueError(f"store: 'failed' is {failed!r}, not a str or null")
    return {**counts, "failed": failed}


def _field(data: Mapping[str, Any], key: str, kind: type, where: str = "the report") -> Any:
    value = data.get(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: {key!r} is {value!r}, not a {kind.__name__}")
    return value


def _entry(item: object, fields: Mapping[str, type], where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError(f"{where} is {item!r}, not an object")
    return {key: _field(item, key, kind, where) for key, kind in fields.items()}

