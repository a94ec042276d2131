"""What ``buildops doctor`` finds here: versions, the GPU, what each backend says of itself (Triton's target), the
caches, every setting and where its value came from, and whether the shared store answers. JSON-able data only;
:mod:`buildops.cli` prints it.

Every probe catches its own failures and reports them as text: doctor is run when something is wrong, so it must
not stop at the first thing that is. Libraries are imported here, when doctor runs, never at import.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._config import ConfigError, declared, origin, redact_url, settings
from ._core import extensions
from ._runtime.node import lock_directory
from ._version import __version__

__all__ = ["STORE_VARIABLE", "diagnose", "hide_passwords", "redact_url"]

# The variable that names the shared artifact store (a URL, e.g. redis://host:6379/0)
STORE_VARIABLE = "BUILDOPS_STORE"



def diagnose() -> dict[str, Any]:
    """Everything doctor reports, as JSON-able data, with ``problems``: one line per thing that needs fixing (a
    bad setting, a configured store that does not answer); empty when there is none."""
    found: dict[str, Any] = {
        "versions": versions(),
        "cuda": cuda(),
        "backends": backends_found(),
        "caches": caches(),
        "settings": settings_found(),
        "store": _store_status(),
    }
    problems = [entry["error"] for entry in found["settings"].values() if "error" in entry]
    if found["store"].get("reachable") is False:
        problems.append(f"store {found['store']['url']}: {found['store']['error']}")
    found["problems"] = problems
    return found


def one_line(error: BaseException) -> str:
    """``Type: message``, the message's first line only."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def versions() -> dict[str, str]:
    """Python's and buildops' versions, and each library's, or ``not installed``, or why its import failed."""
    # torch, each backend's library, and the store's client, by the names they import as
    libraries = dict.fromkeys(["torch", *(b.library for b in extensions.backends()), "redis"])
    return {"python": platform.python_version(), "buildops": __version__,
            **{name: _library_version(name) for name in libraries}}


def _library_version(name: str) -> str:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            return "not installed"
        return f"import failed: {one_line(error)}"  # installed, but something it needs is not
    except Exception as error:  # noqa: BLE001 - a library that fails to import is reported, not raised
        return f"import failed: {one_line(error)}"
    version = getattr(module, "__version__", None)
    return str(version) if version else "installed (no __version__)"


def cuda() -> dict[str, Any]:
    """Whether torch sees a CUDA (or ROCm) device, its runtime's version, and each device's name and compute
    capability. Without a device, nothing is initialized."""
    try:
        import torch

        runtime = torch.version.cuda or getattr(torch.version, "hip", None)
        if not torch.cuda.is_available():
            return {"available": False, "runtime": runtime, "devices": []}
        devices = [{"index": i, "name": torch.cuda.get_device_name(i),
                    "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
                   for i in range(torch.cuda.device_count())]
    except Exception as error:  # noqa: BLE001 - a broken torch or driver is reported, not raised
        return {"available": False, "error": one_line(error)}
    return {"available": True, "runtime": runtime, "devices": devices}


def backends_found() -> dict[str, dict[str, str]]:
    """What each installed backend says of itself beyond its cache (the ``Backend`` contract's ``describe``), by
    backend: ``{label: text}``, or ``{"error": ...}`` where it could not say."""
    found: dict[str, dict[str, str]] = {}
    for backend in extensions.backends():
        if backend.describe is None or not backend.installed():
            continue
        try:
            found[backend.name] = {str(k): str(v) for k, v in extensions.load(backend.describe)().items()}
        except Exception as error:  # noqa: BLE001 - a backend that cannot say is reported, not raised
            found[backend.name] = {"error": one_line(error)}
    return found


def caches() -> dict[str, dict[str, Any]]:
    """Each backend's kernel cache and buildops' node-lock directory, each as :func:`directory` describes it; where
    the path is not known (a library not installed, locks off), ``path`` is None and ``note`` says why."""
    found = {backend.name: _cache(functools.partial(_backend_cache, backend))
             for backend in extensions.backends() if backend.cache is not None}
    return {**found, "node_locks": _cache(_node_lock_directory)}


class _NoPath(Exception):
    """A cache whose path is not known here, and why."""


def _cache(where: Callable[[], str | os.PathLike[str]]) -> dict[str, Any]:
    try:
        path = where()
    except (_NoPath, LookupError) as why:
        return {"path": None, "note": str(why)}
    except Exception as error:  # noqa: BLE001 - a library that cannot say where its cache is: reported
        return {"path": None, "note": one_line(error)}
    return directory(Path(path))


def _backend_cache(backend: extensions.Backend) -> str | os.PathLike[str]:
    """Asked whether or not its library is installed: a cache may be known without it (DeepGEMM's)."""
    assert backend.cache is not None  # only backends with a cache are asked
    try:
        return extensions.load(backend.cache)()
    except ModuleNotFoundError as error:
        if error.name == backend.library:
            raise _NoPath(f"{backend.library} not installed") from None
        raise


def _node_lock_directory() -> Path:
    try:
        path = lock_directory()
    except ConfigError:
        raise _NoPath("BUILDOPS_NODE_LOCKS is bad (see settings)") from None
    if path is None:
        raise _NoPath("off (BUILDOPS_NODE_LOCKS)")
    return path


def directory(path: Path) -> dict[str, Any]:
    """``path``: whether it ``exists``; whether it is ``writable`` by this user (where it does not exist: whether
    the nearest directory above it that does is, so that it can be made); its top-level ``entries`` and the
    ``top_level_bytes`` of the plain files among them (a cheap look: subdirectories are not walked)."""
    found: dict[str, Any] = {"path": str(path), "exists": path.is_dir()}
    nearest = path
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    found["writable"] = os.access(nearest, os.W_OK)
    if not found["exists"]:
        return found
    entries = size = 0
    try:
        with os.scandir(path) as listing:
            for entry in listing:
                entries += 1
                if entry.is_file(follow_symlinks=False):
                    size += entry.stat(follow_symlinks=False).st_size
    except OSError as error:
        return {**found, "note": f"cannot list it: {one_line(error)}"}
    return {**found, "entries": entries, "top_level_bytes": size}


def settings_found() -> dict[str, dict[str, Any]]:
    """Every declared setting, by name: its ``env`` variable, ``source`` (``env``, ``default`` or ``scope``), and
    its ``value`` (JSON-able: a tuple as a list; a password in a URL as ``***``) or, for a bad one, the
    :class:`ConfigError` text as ``error``."""
    found = {}
    for name, setting in declared().items():
        entry: dict[str, Any] = {"env": setting.env, "source": origin(name)}
        try:
            value = setting.__get__(settings)
        except ConfigError as error:
            entry["error"] = str(error)
        else:  # a URL setting (the store's) may hold a password: never shown
            entry["value"] = redact_url(value) if isinstance(value, str) else value
        found[name] = entry
    return found


def _store_status() -> dict[str, Any]:
    """Whether the shared store that ``BUILDOPS_STORE`` names answers.

    ``{"configured": False}`` when the variable is unset or blank; otherwise ``configured``, its ``url`` with any
    password replaced by ``***``, ``reachable``, and what the store's ``stats()`` returned (``stats``) or why it
    could not be opened or asked (``error``, passwords hidden too).
    """
    url = os.environ.get(STORE_VARIABLE, "").strip()
    if not url:
        return {"configured": False}
    status: dict[str, Any] = {"configured": True, "url": redact_url(url)}
    try:
        from .store import open_store

        store = open_store(settings.store, settings.store_timeout)
        try:
            stats = store.stats()
        finally:
            store.close()
    except Exception as error:  # noqa: BLE001 - a store that fails in any way is reported, not raised
        return {**status, "reachable": False, "error": hide_passwords(one_line(error), url)}
    return {**status, "reachable": True, "stats": stats}


def hide_passwords(text: str, url: str) -> str:
    """``text`` (an error that may quote the URL or its password) with the URL and its passwords hidden."""
    text = text.replace(url, redact_url(url))
    for password in _passwords(url):
        text = text.replace(password, "***")
    return text


def _passwords(url: str) -> set[str]:
    """The passwords in ``url``, as written and percent-decoded."""
    found = set()
    user_part = url.partition("://")[2].rpartition("@")[0]
    if ":" in user_part:
        found.add(user_part.partition(":")[2])
    found.update(re.findall(r"(?i)[?&]password=([^&#]*)", url))
    found |= {urllib.parse.unquote(password) for password in found}
    return {password for password in found if password}
