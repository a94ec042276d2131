"""The ``buildops`` command line (also ``python -m buildops``).

Each subcommand is one function registered with :func:`subcommand`: its name, a one-line help, its arguments
(:func:`argument`), and a body that takes the parsed arguments and returns the exit status:

* 0: done;
* 1: done, and found a problem (``doctor``: a bad setting, a store that does not answer; ``prebuild``: an entry
  that failed or was refused; ``store``: a store that fails);
* 2: bad usage, or an input it cannot read: one line on stderr, ``buildops: error: ...``, no traceback.

Output a machine reads has a ``--json`` flag (:data:`JSON`). This module prints; the library code it calls logs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ._config import ConfigError, as_env, builder_only_workers, cpu_share, origin, settings
from ._version import __version__
from .reporting import describe_store, format_report
from .saved_reports import load_report

if TYPE_CHECKING:
    from .manifests import PrebuildOutcome
    from .store import BuildStore

__all__ = ["JSON", "UsageError", "argument", "main", "subcommand"]


class UsageError(Exception):
    """Bad usage, or an input that cannot be read: :func:`main` prints the message on one line and returns 2."""


@dataclass(frozen=True)
class _Argument:
    flags: tuple[str, ...]
    options: dict[str, Any]


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    arguments: tuple[_Argument, ...]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, _Command] = {}


def argument(*flags: str, **options: Any) -> _Argument:
    """One argument of a subcommand: what ``ArgumentParser.add_argument`` takes."""
    return _Argument(flags, options)


# The exit status of a command that a closed pipe ended (128 + SIGPIPE), as a shell reports it.
SIGPIPE_STATUS = 141
JSON = argument("--json", action="store_true", help="print JSON, for a machine to read")


def subcommand(name: str, help: str, *arguments: _Argument) -> Callable[[Callable[[argparse.Namespace], int]],
                                                                         Callable[[argparse.Namespace], int]]:
    """Register the decorated function as ``buildops NAME``: it gets the parsed arguments and returns the exit
    status; it raises :class:`UsageError` for bad usage or an unreadable input. Subcommands are listed in the
    order they are registered."""
    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = _Command(name, help, arguments, run)
        return run
    return register


class _Parser(argparse.ArgumentParser):
    # argparse prints its usage and exits on a usage error; main wants one line and a return value instead.
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def parser() -> argparse.ArgumentParser:
    """The parser of the command line, with every registered subcommand."""
    top = _Parser(prog="buildops", description="Inspect buildops, prebuild a manifest, look into the build store. "
                  "Exit status: 0 done, 1 a problem found, 2 bad usage or an unreadable input.")
    top.add_argument("--version", action="version", version=f"buildops {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for command in _COMMANDS.values():
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        for arg in command.arguments:
            sub.add_argument(*arg.flags, **arg.options)
        sub.set_defaults(run=command.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    try:
        try:
            args = parser().parse_args(argv)
        except SystemExit as done:  # --help, --version: printed, and done
            return done.code if isinstance(done.code, int) else 0
        return args.run(args)
    except UsageError as error:
        print(f"buildops: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe (`buildops report r.json | head -1`): end quietly, as a command killed by
        # SIGPIPE does; stdout goes to /dev/null so that the interpreter's last flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_STATUS


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


@subcommand("report", "print a report saved by Report.save: the table Report.format() prints, or its JSON",
            argument("file", metavar="FILE.json", help="the saved report"), JSON)
def _report(args: argparse.Namespace) -> int:
    try:
        data = load_report(args.file)
    except OSError as error:
        raise UsageError(f"cannot read {args.file}: {error.strerror or error}") from None
    except ValueError as error:  # load_report's message names the file
        raise UsageError(str(error)) from None
    if args.json:
        _print_json(data)
    else:
        print(format_report(data))
    return 0


@subcommand("doctor", "what buildops finds here: versions, GPU, backends (Triton's target), caches, settings "
            "(and where each came from), store", JSON)
def _doctor(args: argparse.Namespace) -> int:
    from ._doctor import diagnose  # imports the libraries it reports on: only when asked

    found = diagnose()
    if args.json:
        _print_json(found)
    else:
        print("\n".join(_doctor_lines(found)))
    return 1 if found["problems"] else 0


def _doctor_lines(found: dict[str, Any]) -> list[str]:
    """Doctor's findings as text: one section each, in the order of its JSON."""
    return [*_versions_lines(found["versions"]), *_cuda_lines(found["cuda"]),
            *_backends_lines(found["backends"]), *_caches_lines(found["caches"]),
            *_settings_lines(found["settings"]), _store_line(found["store"]), *_problems_lines(found["problems"])]


def _columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows of cells, each column left-aligned as wide as its widest cell but the last."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)] if rows else []
    return [indent + "  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip() for row in rows]


def _versions_lines(versions: dict[str, str]) -> list[str]:
    return ["versions:", *_columns(list(versions.items()))]


def _cuda_lines(cuda: dict[str, Any]) -> list[str]:
    if "error" in cuda:
        return [f"cuda: unknown ({cuda['error']})"]
    runtime = f" (runtime {cuda['runtime']})" if cuda.get("runtime") else " (torch built without CUDA)"
    if not cuda["available"]:
        return [f"cuda: no device{runtime}"]
    return [f"cuda: {len(cuda['devices'])} device(s){runtime}",
            *(f"  {d['index']}: {d['name']}, capability {d['capability']}" for d in cuda["devices"])]


def _backends_lines(backends: dict[str, dict[str, str]]) -> list[str]:
    return [f"{name} {label}: {text}" for name, said in backends.items() for label, text in said.items()]


def _caches_lines(caches: dict[str, dict[str, Any]]) -> list[str]:
    rows = [(name, cache["path"] or "-", _cache_state(cache)) for name, cache in caches.items()]
    return ["caches:", *_columns(rows)]


def _cache_state(cache: dict[str, Any]) -> str:
    if cache["path"] is None:
        return cache["note"]
    writable = "writable" if cache["writable"] else "not writable"
    if not cache["exists"]:
        return f"missing ({'can be made' if cache['writable'] else 'cannot be made'})"
    if "note" in cache:
        return f"{writable}, {cache['note']}"
    size = f", {cache['top_level_bytes']} bytes in top-level files" if cache["top_level_bytes"] else ""
    return f"{writable}, {cache['entries']} entries{size}"


def _settings_lines(found: dict[str, dict[str, Any]]) -> list[str]:
    rows = [(entry["env"], f"error: {entry['error']}" if "error" in entry else _as_text(entry["value"]),
             entry["source"]) for entry in found.values()]
    return ["settings (variable, value, source):", *_columns(rows)]


def _as_text(value: object) -> str:
    """A setting's value as its variable would say it; the empty default as ``''``."""
    return as_env(value) or "''"


def _store_line(store: dict[str, Any]) -> str:
    if not store["configured"]:
        return "store: not configured (BUILDOPS_STORE is unset)"
    if not store["reachable"]:
        return f"store: {store['url']}: not reachable: {store['error']}"
    return f"store: {store['url']}: reachable; {_contents(store['stats'])}"


def _problems_lines(problems: list[str]) -> list[str]:
    if not problems:
        return ["problems: none"]
    return [f"problems ({len(problems)}):", *(f"  {problem}" for problem in problems)]


# -- prebuild -------------------------------------------------------------------------------------------------------

@subcommand("prebuild", "build every entry of a manifest saved by save_manifest into the local caches and, with "
            "BUILDOPS_STORE set, the build store",
            argument("manifest", metavar="MANIFEST.json", help="the saved manifest"), JSON)
def _prebuild(args: argparse.Namespace) -> int:
    import buildops

    from ._core.default import default_builder
    from .manifests import prebuild

    try:
        settings.store  # noqa: B018 - a bad BUILDOPS_STORE is a usage error here, as for `buildops store`
    except ConfigError as error:
        raise UsageError(str(error)) from None
    # No engine starts beside a prebuild: every CPU builds, unless BUILDOPS_THREADS says otherwise
    every_cpu = origin("threads") == "default"
    with settings.scope(threads=builder_only_workers(cpu_share())) if every_cpu else contextlib.nullcontext():
        try:
            outcome = prebuild(args.manifest)
        except ValueError as error:  # load_manifest's message names the file
            raise UsageError(str(error)) from None
        counts = default_builder().store_counts()
        buildops.shutdown()
    store = None if counts is None else dataclasses.asdict(counts)
    if args.json:
        _print_json({**outcome.as_dict(), "store": store})
    else:
        print("\n".join(_prebuild_lines(args.manifest, outcome, store)))
    return 1 if outcome.failed or outcome.refused else 0


def _prebuild_lines(manifest: str, outcome: PrebuildOutcome, store: dict[str, Any] | None) -> list[str]:
    """What prebuild did: the counts on one line, then each entry not built with why, then the store's line."""
    lines = [f"{manifest}: {outcome.compiled} compiled, {outcome.cached} cached, {outcome.fetched} fetched from the "
             f"store, {len(outcome.failed)} failed, {len(outcome.refused)} refused, {len(outcome.not_prebuilt)} not "
             "prebuilt"]
    for what, entries in (("failed", outcome.failed), ("refused", outcome.refused),
                          ("not prebuilt", outcome.not_prebuilt)):
        lines += [f"{what}: {label}: {why}" for label, why in entries]
    if store is not None:
        lines.append(describe_store(store))
    return lines


# -- store ----------------------------------------------------------------------------------------------------------

@subcommand("store", "look into the build store BUILDOPS_STORE names: stats (counts), ls (each artifact), clear "
            "(remove every artifact and claim of buildops; needs --yes), init (make a file:/// store's directory)",
            argument("action", choices=("stats", "ls", "clear", "init"), help="what to do"),
            argument("--yes", action="store_true", help="clear: yes, remove everything buildops keeps there"), JSON)
def _store(args: argparse.Namespace) -> int:
    from .store import StoreError

    if args.action == "clear" and not args.yes:
        raise UsageError("store clear removes every artifact and claim of buildops from the store, for every node: "
                         "add --yes to do it")
    try:
        with _opened_store(create=args.action == "init") as store:
            _STORE_ACTIONS[args.action](store, args.json)
    except StoreError as error:
        print(f"buildops: {_scrubbed(error)}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _opened_store(create: bool = False) -> Iterator[BuildStore]:
    """The store the settings name (a ``file:///`` store's directory made if ``create``), closed after;
    :class:`UsageError` where none is named or the URL is bad."""
    from .store import open_store

    try:
        url = settings.store
    except ConfigError as error:  # its text shows the URL with its password hidden
        raise UsageError(str(error)) from None
    if not url:
        raise UsageError("no build store configured: set BUILDOPS_STORE to redis://[:PASSWORD@]HOST:PORT/DB, "
                         "rediss://... (TLS) or file:///ABSOLUTE/DIR")
    try:
        store = open_store(url, settings.store_timeout, create)
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        yield store
    finally:
        store.close()


def _scrubbed(error: BaseException) -> str:
    """The first line of a store's error, any password of BUILDOPS_STORE hidden (its errors should hold none)."""
    from ._doctor import hide_passwords

    return hide_passwords(str(error).strip().partition("\n")[0], settings.store)


def _store_stats(store: BuildStore, as_json: bool) -> None:
    stats = store.stats()
    if as_json:
        _print_json(stats)
    else:
        print("\n".join(_columns([(name, str(value)) for name, value in stats.items()], indent="")))


def _store_ls(store: BuildStore, as_json: bool) -> None:
    entries = sorted(store.entries())
    if as_json:
        _print_json([{"key": key, "bytes": size} for key, size in entries])
    elif entries:
        print("\n".join(_columns([(key, str(size)) for key, size in entries], indent="")))


def _store_clear(store: BuildStore, as_json: bool) -> None:
    removed = store.clear()
    if as_json:
        _print_json({"store": store.where, "removed": removed})
    else:
        print(f"store {store.where}: removed {removed} artifact(s) and claim(s)")


def _contents(stats: dict[str, Any]) -> str:
    """What a store's ``stats()`` says, in words; an empty store said to be so."""
    artifacts, size, claims = stats.get("artifacts", 0), stats.get("bytes", 0), stats.get("claims", 0)
    held = f", {claims} claim(s) held" if claims else ""
    if not artifacts:
        return f"empty (no build has stored an artifact there yet){held}"
    return f"{artifacts} artifact(s), {size / 1e6:.1f} MB{held}"


def _store_init(store: BuildStore, as_json: bool) -> None:
    stats = store.stats()
    if as_json:
        _print_json(stats)
    else:
        print(f"store {store.where}: ready; {_contents(stats)}")


_STORE_ACTIONS: dict[str, Callable[[BuildStore, bool], None]] = {
    "stats": _store_stats, "ls": _store_ls, "clear": _store_clear, "init": _store_init}
