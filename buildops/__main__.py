"""``python -m buildops``: the command line (:mod:`buildops.cli`)."""

from buildops.cli import main

# Only when run: a tool that imports every module of the package (a docs builder, pkgutil) must not start it.
if __name__ == "__main__":
    raise SystemExit(main())
