"""What a ``BUILDOPS_*`` setting is (:class:`Setting`, a typed descriptor) and the kinds of value one may hold:
each kind parses its variable's text and says what it expected where the text is bad (:class:`ConfigError`)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import urllib.parse
from collections.abc import Callable
from typing import Any, Generic, NoReturn, Protocol, TypeVar, cast, overload

__all__ = ["Choice", "ConfigError", "Count", "Flag", "NodeLocks", "Seconds", "Setting", "SettingsLike", "Span",
           "StoreUrl", "Target", "Whole", "redact_url"]

T = TypeVar("T")
S = TypeVar("S", bound=str)
N = TypeVar("N", int, float)


class SettingsLike(Protocol):
    """The settings object a :class:`Setting` is read on."""

    def scoped(self, name: str) -> tuple[bool, Any]:
        """Whether ``scope()`` overrides setting ``name`` now, and with what value."""
        ...


class ConfigError(ValueError):
    """A ``BUILDOPS_*`` setting has a value buildops cannot use."""


class Setting(Generic[T]):
    """One ``BUILDOPS_*`` variable, declared on the settings class. Read on ``settings`` it gives the value now, a
    ``T``; read on the class it gives this declaration: ``env``, ``doc``, ``expected``, ``default``."""

    expected = ""  # what a value may be, in errors and in the docs' table

    def __init__(self, env: str, doc: str, default: Callable[[], T], *, default_doc: str | None = None,
                 expected: str | None = None) -> None:
        self.env = env
        self.doc = doc
        self.default = default  # called when the variable is unset, never before
        self.default_doc = default_doc  # the default in words, for the docs, where it is computed
        self.expected = self.expected if expected is None else expected
        self.name = ""
        self.__doc__ = f"{env}: {doc}\nValues: {self.expected}."

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.env})>"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: SettingsLike, owner: type | None = None) -> T: ...

    def __get__(self, obj: SettingsLike | None, owner: type | None = None) -> T | Setting[T]:
        if obj is None:
            return self
        scoped, value = obj.scoped(self.name)
        if scoped:
            return cast(T, value)  # scope() stored what parse() returned
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default()
        return self.parse(raw)

    # A data descriptor, so help() shows its doc; `value: NoReturn` makes type checkers refuse any assignment.
    def __set__(self, obj: SettingsLike, value: NoReturn) -> NoReturn:
        raise AttributeError(f"settings.{self.name} is read from {self.env}; override it with "
                             f"settings.scope({self.name}=...)")

    def parse(self, raw: str) -> T:
        """``raw`` as a value of this variable, or a :class:`ConfigError` naming it."""
        value = self._convert(raw.strip())
        if value is None:
            raise ConfigError(f"{self.env}={self.shown(raw)}: expected {self.expected}")
        return value

    def shown(self, raw: str) -> str:
        """``raw`` as errors and logs may show it."""
        return repr(raw)

    def _convert(self, value: str) -> T | None:
        """``value`` (stripped) as a ``T``, or None where it is not one."""
        raise NotImplementedError


def _switch(value: str) -> bool | None:
    value = value.lower()
    return True if value in ("1", "true", "yes", "on") else False if value in ("0", "false", "no", "off") else None


def _number(kind: Callable[[str], N], value: str) -> N | None:
    with contextlib.suppress(ValueError):
        return kind(value)
    return None


class Flag(Setting[bool]):
    expected = "1 or 0 (also true/false, yes/no, on/off)"

    def _convert(self, value: str) -> bool | None:
        return _switch(value)


class Count(Setting[int]):
    expected = "a whole number >= 1"

    def _convert(self, value: str) -> int | None:
        count = _number(int, value)
        return count if count is not None and count >= 1 else None


class Whole(Setting[int]):
    def __init__(self, env: str, doc: str, default: Callable[[], int], *, expected: str,
                 at_most: int | None = None) -> None:
        super().__init__(env, doc, default, expected=expected)
        self.at_most = at_most

    def _convert(self, value: str) -> int | None:
        if not (value.isascii() and value.isdigit()):  # isdigit alone takes "²", which int() refuses
            return None
        number = int(value)
        return number if self.at_most is None or number <= self.at_most else None


class Seconds(Setting[float]):
    expected = "a number of seconds >= 0"

    def _convert(self, value: str) -> float | None:
        seconds = _number(float, value)
        return seconds if seconds is not None and seconds >= 0 else None  # nan compares false: refused


class Span(Setting[float]):
    """Seconds that must pass: more than 0 and finite (a lease of 0 excludes no one; one of inf never lapses)."""

    expected = "a number of seconds > 0, finite"

    def _convert(self, value: str) -> float | None:
        seconds = _number(float, value)
        return seconds if seconds is not None and 0 < seconds < math.inf else None


class Choice(Setting[S]):
    def __init__(self, env: str, doc: str, default: Callable[[], S], *, choices: tuple[S, ...]) -> None:
        super().__init__(env, doc, default, expected=f"one of {', '.join(choices)}")
        self.choices = choices

    def _convert(self, value: str) -> S | None:
        return next((choice for choice in self.choices if choice == value.lower()), None)


class Target(Setting[tuple[str, int]]):
    expected = "BACKEND:ARCH, e.g. cuda:90 (Hopper) or cuda:80 (Ampere)"

    def _convert(self, value: str) -> tuple[str, int] | None:
        backend, _, arch = value.partition(":")
        if backend not in ("cuda", "hip") or not (arch.isascii() and arch.isdigit()):
            return None
        return backend, int(arch)


class NodeLocks(Setting[str]):
    # "off", or the directory ("" for the default one). Relative ones are refused: every process must name the same.
    expected = "an absolute directory, which every process of the node names alike, or off"

    def _convert(self, value: str) -> str | None:
        switch = _switch(value) if value else True
        if switch is not None:
            return "" if switch else "off"
        path = os.path.expanduser(value)
        return path if os.path.isabs(path) else None


class StoreUrl(Setting[str]):
    expected = "redis://[:PASSWORD@]HOST:PORT/DB, rediss://... (TLS) or file:///ABSOLUTE/DIR, or empty"

    def _convert(self, value: str) -> str | None:
        if not value:
            return ""
        parsed = urllib.parse.urlsplit(value)
        if parsed.scheme in ("redis", "rediss"):  # parsed whole: a bad port or database fails here, not at a build
            try:
                parsed.port  # noqa: B018 - reading it raises for a port that is not a number in range
            except ValueError:
                return None
            database = parsed.path.removeprefix("/")
            return value if parsed.hostname and (not database or database.isdigit()) else None
        if parsed.scheme == "file":
            return value if not parsed.netloc and parsed.path.startswith("/") and parsed.path != "/" else None
        return None

    def shown(self, raw: str) -> str:
        return repr(redact_url(raw))


def redact_url(url: str) -> str:
    """``url`` with its password, in the user part (``redis://:PW@host``, ``redis://user:PW@host``) or a
    ``password=`` query parameter, replaced by ``***``."""
    scheme, separator, rest = url.partition("://")
    if separator and "@" in rest:
        # The last "@" ends the user part, as URL parsers read it; a password may hold "#", "/" or "?" unescaped.
        user_part, _, host_part = rest.rpartition("@")
        if ":" in user_part:
            rest = f"{user_part.partition(':')[0]}:***@{host_part}"
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", f"{scheme}{separator}{rest}")


