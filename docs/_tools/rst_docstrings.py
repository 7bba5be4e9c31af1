"""A griffe extension: the library's docstrings, written in reStructuredText's inline
style for ``help()``, rendered as Markdown by mkdocstrings.

- ``:class:`Name``` and the other roles become code linked to the name's reference
  entry (an optional cross-reference: a name with no entry stays plain code);
  ``~a.b.Name`` shows ``Name``.
- A paragraph ending in ``::`` and the indented block after it become a fenced code
  block, Python when the block parses as Python.
"""

from __future__ import annotations

import ast
import html
import re
import textwrap
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def _target(obj: griffe.Object, name: str) -> str:
    """The full path ``name`` means in ``obj``'s scope, or ``name`` if it resolves nowhere."""
    head, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            found = scope.resolve(head)
        except (griffe.NameResolutionError, ValueError):
            scope = scope.parent
            continue
        return f"{found}.{rest}" if rest else found
    return name


def _roles(obj: griffe.Object, text: str) -> str:
    def link(match: re.Match[str]) -> str:
        short, name = match.groups()
        shown = name.rsplit(".", 1)[-1] if short else name
        identifier = html.escape(_target(obj, name.rstrip("()")), quote=True)
        code = f"<code>{html.escape(shown)}</code>"
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    return ROLE.sub(link, text)


def _literal_blocks(text: str) -> str:
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        intro = line.rstrip()[:-2].rstrip()
        if intro:
            out.append(intro + ":")
        indent = len(line) - len(line.lstrip())
        block = []
        while index < len(lines) and (
            not lines[index].strip() or len(lines[index]) - len(lines[index].lstrip()) > indent
        ):
            block.append(lines[index])
            index += 1
        while block and not block[-1].strip():
            block.pop()
        code = textwrap.dedent("\n".join(block)).strip("\n")
        language = "python" if _is_python(code) else "text"
        out += ["", " " * indent + f"```{language}"]
        out += [" " * indent + row if row else "" for row in code.split("\n")]
        out += [" " * indent + "```", ""]
    return "\n".join(out)


def _is_python(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


class RstDocstrings(griffe.Extension):
    """Rewrites each docstring once its package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._rewrite(pkg, set())

    def _rewrite(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = _roles(obj, _literal_blocks(obj.docstring.value))
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, seen)
