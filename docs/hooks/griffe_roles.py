"""Griffe extension: render the Sphinx roles in buildops' docstrings as links in the API reference.

The docstrings name other objects the way ``help()`` readers and Sphinx expect (``:func:`join```,
``:class:`~buildops.rehearsal```). Markdown has no such roles, so mkdocstrings would print them as they are. This
extension rewrites each role, in the docs build only, into a cross-reference to the object it names, resolved
from the docstring's own scope as Python would. The reference is optional: a name the site does not render (a
private helper) becomes plain code instead of a broken link. Run ``mkdocs build -v`` to see which roles did not
resolve.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

import griffe

logger = logging.getLogger("mkdocs.hooks.griffe_roles")

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


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx cross-reference roles in docstrings into optional mkdocstrings cross-references."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(lambda match: self._link(obj, match), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)

    def _link(self, obj: griffe.Object, match: re.Match) -> str:
        short, target, parens = match.group(1), match.group(2).strip(), match.group(3) or ""
        text = (target.rpartition(".")[2] if short else target) + parens
        resolved = _resolve(obj, target)
        if resolved is None:
            logger.debug("griffe_roles: %s: %r does not resolve; rendered as code", obj.path, target)
            return f"`{text}`"
        return (f'<autoref identifier="{html.escape(resolved)}" optional><code>{html.escape(text)}</code>'
                f"</autoref>")
