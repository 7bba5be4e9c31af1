"""The code blocks of the docs' pages and README.md, as the tests run them.

A page's ``python`` and ``bash`` blocks run in order, in one process per page, in a
fresh working directory that holds links to the repository's ``samples/`` and
``bench/`` (so commands written from the repository root run as written); Python
blocks share one namespace and import the modules that ``file`` blocks wrote there. A
``text`` block titled ``Output`` right after a block that runs is what that block
prints: the test compares it with doctest's rules (``...`` stands for any text, runs of
whitespace are equal). Other blocks (``text``,
``toml``, ``json``) are shown, not run.

An HTML comment on the line before a block changes what is done with it:

- ``<!-- docs: skip: REASON -->``: not run; the reason is required.
- ``<!-- docs: needs NEED -->``: run only where NEED is available (one of ``NEEDS``;
  CI's own steps set ``PROGRAMLOGIC_DOCS_NEEDS``); elsewhere the page's test for NEED
  is skipped, saying so. ``<!-- docs: page needs NEED -->`` anywhere marks every block
  of the page.
- ``<!-- docs: file PATH -->``: written to PATH in the working directory, not run.
- ``<!-- docs: pytest -->``: written to a test file and run with pytest; it must pass.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

__all__ = ["NEEDS", "Block", "Page", "PageError", "parse_page"]

NEEDS = ("tff", "ray", "postgresql", "flower", "kill")
RUN = ("python", "bash")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<what>.*?)\s*-->\s*$")


class PageError(ValueError):
    """A page whose blocks break the rules above; the message names the page and line."""


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its language, code, first line, and what is done with it."""

    language: str
    code: str
    line: int
    action: str = "run"  # "run", "skip", "file" or "pytest"
    argument: str = ""  # the skip's reason or the file's path
    need: str | None = None
    output: str | None = None  # the Output block shown after it


@dataclasses.dataclass(frozen=True)
class Page:
    path: Path
    blocks: list[Block]
    need: str | None = None

    def needs(self) -> set[str]:
        """Every need of the page or of one of its blocks."""
        found = {block.need for block in self.blocks if block.need}
        return found | ({self.need} if self.need else set())


def _fences(text: str) -> list[tuple[int, str, str, str]]:
    """``(line, marker, info, code)`` of each top-level fenced block."""
    lines, found, index = text.split("\n"), [], 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        start, body = index, []
        index += 1
        while index < len(lines) and lines[index].strip() != fence:
            body.append(lines[index].removeprefix(indent))
            index += 1
        marker = MARKER.match(lines[start - 1]) if start else None
        found.append((start + 1, marker["what"] if marker else "", info, "\n".join(body) + "\n"))
        index += 1
    return found


def _check_need(need: str, where: str) -> str:
    if need not in NEEDS:
        raise PageError(f"{where}: unknown need {need!r}, expected one of {', '.join(NEEDS)}")
    return need


def parse_page(path: Path) -> Page:
    """The blocks of the Markdown page at ``path``; ``PageError`` if a rule is broken."""
    text = path.read_text()
    page_need = None
    for number, line in enumerate(text.split("\n"), 1):
        marker = MARKER.match(line)
        if marker and marker["what"].startswith("page needs "):
            page_need = _check_need(marker["what"].removeprefix("page needs "), f"{path}:{number}")
    blocks: list[Block] = []
    for line, what, info, code in _fences(text):
        where = f"{path}:{line}"
        language = info.split()[0] if info else ""
        if language == "text" and re.search(r'title="Output"', info):
            previous = blocks[-1] if blocks else None
            if previous is None or previous.action not in ("run", "pytest") or previous.output:
                raise PageError(f"{where}: an Output block must follow a block that runs")
            blocks[-1] = dataclasses.replace(previous, output=code)
            continue
        action, argument, need = "run" if language in RUN else "show", "", None
        if what.startswith("skip"):
            action, argument = "skip", what.removeprefix("skip").lstrip(":").strip()
            if not argument:
                raise PageError(f"{where}: a skip needs its reason: <!-- docs: skip: REASON -->")
        elif what.startswith("needs "):
            need = _check_need(what.removeprefix("needs ").strip(), where)
        elif what.startswith("file "):
            action, argument = "file", what.removeprefix("file ").strip()
        elif what == "pytest":
            action = "pytest"
        elif what and not what.startswith("page needs"):
            raise PageError(f"{where}: unknown docs marker {what!r}")
        if action == "show" and need:
            raise PageError(f"{where}: a {language or 'plain'} block is not run, so needs nothing")
        blocks.append(Block(language, code, line, action, argument, need))
    return Page(path, [block for block in blocks if block.action != "show"], page_need)
