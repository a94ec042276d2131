"""Griffe extension: read buildops' docstrings as they are written for ``help()``, in the API reference.

Two conventions of the docstrings that mkdocstrings' Google-style parser does not know are rewritten, in the docs
build only:

* Sphinx roles. The docstrings name other objects the way ``help()`` readers and Sphinx expect (``:func:`join```,
  ``:class:`~buildops.rehearsal```). Markdown has no such roles, so mkdocstrings would print them as they are.
  Each becomes a cross-reference to the object it names, resolved from the docstring's own scope as Python would.
  The reference is optional: a name the site does not render (a private helper) becomes plain code instead of a
  broken link. Run ``mkdocs build -v`` to see which roles did not resolve.
* Lists that follow their introducing line directly ("Contract:" then "  * ``key`` ..."), which Markdown would
  fold into that line's paragraph. Each gets the blank line before it that Markdown needs.
* Parameters documented together (``output, name: as for lists_kernels``) in an ``Args:`` section. Each parameter
  gets the entry of its own, so the parser's check of documented parameters against the signature still holds.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

import griffe

logger = logging.getLogger("mkdocs.hooks.griffe_docstrings")

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params):\s*$")
_GROUPED = re.compile(r"^(\s+)(\w+(?:\s*,\s*\w+)+):(\s.*)?$")
_ITEM = re.compile(r"^\s{0,3}[*-]\s")
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|obj|exc|const):`(~?)([^`<>]+?)(\(\))?`")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    head, _, rest = target.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            resolved = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError, ValueError):
            scope = scope.parent
            continue
        return f"{resolved}.{rest}" if rest else resolved
    try:  # a full path, such as ``buildops.join``
        obj.modules_collection[target]
    except (KeyError, ValueError, AttributeError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return target


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _split_grouped_parameters(text: str) -> str:
    lines, out, i = text.split("\n"), [], 0
    section: int | None = None  # the indentation of the Args: line while inside that section
    while i < len(lines):
        line = lines[i]
        if _SECTION.match(line):
            section = _indent(line)
        elif line.strip() and section is not None and _indent(line) <= section:
            section = None
        grouped = _GROUPED.match(line) if section is not None else None
        i += 1
        if grouped is None:
            out.append(line)
            continue
        continuation = []  # the entry's further lines: indented deeper than the entry itself
        while i < len(lines) and lines[i].strip() and _indent(lines[i]) > _indent(line):
            continuation.append(lines[i])
            i += 1
        for name in grouped.group(2).split(","):
            out.append(f"{grouped.group(1)}{name.strip()}:{grouped.group(3) or ''}")
            out.extend(continuation)
    return "\n".join(out)


def _blank_line_before_lists(text: str) -> str:
    out: list[str] = []
    in_list = in_fence = False  # in_list: since the last blank line, a list item was seen
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.strip():
            in_list = False
        elif _ITEM.match(line):
            if not in_list and out and out[-1].strip():
                out.append("")
            in_list = True
        out.append(line)
    return "\n".join(out)


class HelpStyleDocstrings(griffe.Extension):
    """Rewrite Sphinx roles and grouped parameters in docstrings (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            value = _blank_line_before_lists(_split_grouped_parameters(obj.docstring.value))
            obj.docstring.value = _ROLE.sub(lambda match: self._link(obj, match), value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)

    def _link(self, obj: griffe.Object, match: re.Match) -> str:
        short, target, parens = match.group(1), match.group(2).strip(), match.group(3) or ""
        text = (target.rpartition(".")[2] if short else target) + parens
        resolved = _resolve(obj, target)
        if resolved is None:
            logger.debug("griffe_docstrings: %s: %r does not resolve; rendered as code", obj.path, target)
            return f"`{text}`"
        return (f'<autoref identifier="{html.escape(resolved)}" optional><code>{html.escape(text)}</code>'
                f"</autoref>")
