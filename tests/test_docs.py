"""The documentation's links resolve: every relative link in README.md, docs/*.md and
benchmarks/RESULTS.md names a file that exists and, with ``#anchor``, a heading in it (the
anchor GitHub derives from the heading's text)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "RESULTS.md",
                *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(path: Path) -> list[str]:
    """The lines of ``path`` outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lstrip("#").strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link reads as its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of ``path``, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = "\n".join(_prose(path))
    return [target for target in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto:


def test_slug_follows_github():
    assert slug("## Load the authors' checkpoints: `python -m dicosa convert`") == \
        "load-the-authors-checkpoints-python--m-dicosa-convert"
    assert slug("# Exclusion queries (\"A without B\")") == "exclusion-queries-a-without-b"
    assert slug("### Training step — `benchmarks/train_step.py`") == \
        "training-step--benchmarkstrain_steppy"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_pages_are_found_and_have_links():
    assert {p.name for p in PAGES} >= {"README.md", "RESULTS.md", "search.md", "heads.md",
                                       "training.md", "index-format.md", "limits.md",
                                       "dependencies.md"}
    assert len(links(REPO / "README.md")) >= 10


def test_readme_is_a_quickstart():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
    text = "\n".join(lines)
    for command in ("make demo", "make test", "dicosa index",
                    "dicosa search", "from dicosa import open_index"):
        assert command in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_machine_paths(page):
    """Documentation names no folder of the machine it was written on."""
    assert not re.search(r"(?<![\w.])/(work|home|root|tmp)/", page.read_text(encoding="utf-8"))
