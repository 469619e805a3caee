"""Every measured figure in README.md and docs/*.md cites the JSON under bench/results/ it comes
from (docs/performance.md, "Method"); a citation of a file that is not there, or that is not
JSON, is a figure nobody can check. Relative links in the same documents must lead to a file."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"bench/results/[A-Za-z0-9_.\-/]+?\.json")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def citations() -> dict[str, list[str]]:
    """Each cited path (relative to the repository) -> the documents that cite it."""
    cited: dict[str, list[str]] = {}
    for doc in documents():
        for path in sorted(set(CITATION.findall(doc.read_text()))):
            cited.setdefault(path, []).append(doc.relative_to(ROOT).as_posix())
    return cited


def test_the_documents_cite_results():
    # a pattern that stopped matching would pass every check below without looking at anything
    assert len(citations()) >= 5


def test_every_cited_result_exists_and_is_json():
    missing, broken = [], []
    for path, docs in citations().items():
        f = ROOT / path
        if not f.is_file():
            missing.append(f"{path} (cited in {', '.join(docs)})")
            continue
        try:
            json.loads(f.read_text())
        except ValueError as e:
            broken.append(f"{path} (cited in {', '.join(docs)}): {e}")
    assert not missing, "cited results that are not in bench/results:\n  " + "\n  ".join(missing)
    assert not broken, "cited results that are not JSON:\n  " + "\n  ".join(broken)


def test_relative_links_lead_to_files():
    dead = []
    for doc in documents():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same document
            if not (doc.parent / target.split("#")[0]).exists():
                dead.append(f"{doc.relative_to(ROOT).as_posix()}: {target}")
    assert not dead, "links to nothing:\n  " + "\n  ".join(dead)
