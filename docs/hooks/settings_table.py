"""MkDocs hook: put the table of ``BUILDOPS_*`` settings into ``settings.md`` at build time.

The table comes from ``buildops._config.markdown_table()``, which generates it from the settings' own
declarations, so the page cannot drift from the code. ``settings.md`` holds the marker below where the table goes.
The build fails, naming what is missing, if the page, the marker or the function is missing: a settings page
without its table must never be published.

Only ``buildops/_config/`` and what it imports run here. The package's ``__init__`` is not executed: it imports
the package's runtime dependencies (wrapt, filelock, ...), which building the docs does not need.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = "<!-- settings-table -->"
PAGE = "settings.md"


def _markdown_table(root: Path) -> str:
    package = root / "buildops"
    if "buildops" not in sys.modules:
        # The package as a namespace for its submodules, without running its __init__ (see the module docstring).
        stub = types.ModuleType("buildops")
        stub.__path__ = [str(package)]
        sys.modules["buildops"] = stub
    try:
        config = importlib.import_module("buildops._config")
    except Exception as error:
        raise PluginError(f"settings_table hook: cannot import buildops._config from {package}: {error!r}") from error
    make = getattr(config, "markdown_table", None)
    if not callable(make):
        raise PluginError(f"settings_table hook: {config.__file__} has no markdown_table() function, which "
                          f"docs/{PAGE} needs to generate its table of settings")
    table = make()
    if not isinstance(table, str) or not table.strip():
        raise PluginError(f"settings_table hook: buildops._config.markdown_table() returned {table!r}, "
                          f"expected the markdown table as a non-empty string")
    return table


def on_files(files, config):
    if files.get_file_from_path(PAGE) is None:
        raise PluginError(f"settings_table hook: docs/{PAGE} is missing; it holds the table of settings")
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if markdown.count(MARKER) != 1:
        raise PluginError(f"settings_table hook: docs/{PAGE} must contain the marker {MARKER} exactly once "
                          f"(found {markdown.count(MARKER)})")
    root = Path(config.config_file_path).resolve().parent
    return markdown.replace(MARKER, _markdown_table(root).strip() + "\n")

