"""Every relative link in README.md and docs/*.md leads to a file or directory inside the
repository.

A markdown link `[text](target)` whose target is not a URL (http, https, mailto) nor an anchor
in the same document (`#...`) must name, relative to the document's own directory and without
its `#anchor`, something that exists; and it must stay inside the repository, which stands
alone: a link to a sibling checkout (`../shared/...`) resolves on one machine and nowhere
else. Links inside fenced code blocks and inline code are examples, not links, and are skipped.
A failure names the document, the line and the target of each dead link.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# [text](target) or [text](target "title"); the text may hold inline code but no brackets
LINK = re.compile(r"\[[^\]\n]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
EXTERNAL = re.compile(r"(?i)^(https?:|mailto:)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def links(doc: Path) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link in `doc`, outside code."""
    out, fenced = [], False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            out.append((number, target))
    return out


def dead(doc: Path, target: str) -> str | None:
    """Why `target`, linked from `doc`, leads nowhere; None if it is fine (or not checked)."""
    if EXTERNAL.match(target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0]
    resolved = (doc.parent / path).resolve()
    if not resolved.is_relative_to(ROOT):
        return "outside the repository"
    if not resolved.exists():
        return "no such file"
    return None


def test_the_documents_have_links():
    # a pattern that stopped matching would pass the check below without looking at anything
    assert sum(len(links(doc)) for doc in documents()) >= 10


def test_the_link_pattern():
    doc = ROOT / "docs" / "x.md"
    line = 'see [a](b.md#c), [`code`](../README.md) and `[not](a-link)` or [t](<d.md> "x")'
    assert LINK.findall(INLINE_CODE.sub("", line)) == ["b.md#c", "../README.md", "d.md"]
    assert dead(doc, "https://example.com/x") is None
    assert dead(doc, "#a-section") is None
    assert dead(doc, "architecture.md#wiring") is None
    assert dead(doc, "nowhere.md") == "no such file"
    assert dead(doc, "../../outside.md") == "outside the repository"


def test_every_relative_link_resolves():
    problems = []
    for doc in documents():
        for number, target in links(doc):
            why = dead(doc, target)
            if why:
                problems.append(f"{doc.relative_to(ROOT).as_posix()}:{number}: {target} ({why})")
    assert not problems, "links that lead nowhere:\n  " + "\n  ".join(problems)
