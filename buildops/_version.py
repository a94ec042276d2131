"""buildops' version: one place, read by the package, its reports and manifests, and pyproject.toml."""

__version__ = "0.2.0"
