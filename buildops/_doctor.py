"""What ``buildops doctor`` finds here: versions, the GPU, the Triton target, the caches, every setting and where
its value came from, and whether the shared store answers. JSON-able data only; :mod:`buildops.cli` prints it.

Every probe catches its own failures and reports them as text: doctor is run when something is wrong, so it must
not stop at the first thing that is. Libraries are imported here, when doctor runs, never at import.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._config import ConfigError, declared, origin, redact_url, settings
from ._runtime.node import lock_directory

__all__ = ["STORE_VARIABLE", "diagnose", "redact_url"]

# The variable that names the shared artifact store (a URL, e.g. redis://host:6379/0)
STORE_VARIABLE = "BUILDOPS_STORE"

# The libraries whose versions doctor reports, by the name they import as
LIBRARIES = ("torch", "triton", "flashinfer", "deep_gemm", "redis")


def diagnose() -> dict[str, Any]:
    """Everything doctor reports, as JSON-able data, with ``problems``: one line per thing that needs fixing (a
    bad setting, a configured store that does not answer); empty when there is none."""
    found: dict[str, Any] = {
        "versions": versions(),
        "cuda": cuda(),
        "triton_target": triton_target(),
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
    from . import __version__

    return {"python": platform.python_version(), "buildops": __version__,
            **{name: _library_version(name) for name in LIBRARIES}}


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


def triton_target() -> dict[str, Any]:
    """The target buildops' Triton builds compile for: the GPU's, or where Triton finds no GPU driver,
    ``BUILDOPS_TRITON_TARGET`` (builds then compile only). ``compile_only`` says which."""
    try:
        from .backends.triton.driver import CompileOnlyDriver, active_driver
    except Exception as error:  # noqa: BLE001 - no Triton, or a broken one
        return {"target": None, "error": one_line(error)}
    try:
        current = active_driver().get_current_target()
        compile_only = isinstance(active_driver(), CompileOnlyDriver)
    except RuntimeError:  # "0 active drivers": no GPU; buildops installs its compile-only driver when it builds
        try:
            backend, arch = settings.triton_target
        except ConfigError as error:
            return {"target": None, "error": str(error)}
        return {"target": f"{backend}:{arch}", "compile_only": True}
    except Exception as error:  # noqa: BLE001 - a driver that fails otherwise is reported, not raised
        return {"target": None, "error": one_line(error)}
    return {"target": f"{current.backend}:{current.arch}", "compile_only": compile_only}


def caches() -> dict[str, dict[str, Any]]:
    """The libraries' kernel caches and buildops' node-lock directory, each as :func:`directory` describes it;
    where the path is not known (a library not installed, locks off), ``path`` is None and ``note`` says why."""
    return {"triton": _cache(_triton_cache), "flashinfer": _cache(_flashinfer_cache),
            "deep_gemm": _cache(_deep_gemm_cache), "node_locks": _cache(_node_lock_directory)}


class _NoPath(Exception):
    """A cache whose path is not known here, and why."""


def _cache(where: Callable[[], str | os.PathLike[str]]) -> dict[str, Any]:
    try:
        path = where()
    except _NoPath as why:
        return {"path": None, "note": str(why)}
    except Exception as error:  # noqa: BLE001 - a library that cannot say where its cache is: reported
        return {"path": None, "note": one_line(error)}
    return directory(Path(path))


def _triton_cache() -> str:
    try:
        from triton import knobs
    except ModuleNotFoundError:
        raise _NoPath("triton not installed") from None
    return knobs.cache.dir


def _flashinfer_cache() -> os.PathLike[str]:
    try:
        from flashinfer.jit import env
    except ModuleNotFoundError:
        raise _NoPath("flashinfer not installed") from None
    return env.FLASHINFER_JIT_DIR


def _deep_gemm_cache() -> str:
    # DeepGEMM's own rule (deep_gemm/jit): DG_JIT_CACHE_DIR, else ~/.deep_gemm; installed or not, it is where it
    # would compile to.
    return os.environ.get("DG_JIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".deep_gemm")


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
        return {**status, "reachable": False, "error": _hide_passwords(one_line(error), url)}
    return {**status, "reachable": True, "stats": stats}


def _hide_passwords(text: str, url: str) -> str:
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
