"""The README's and the docs' references to repository files resolve.

Markdown links and images (``[text](path)``, ``![plot](path)``, with their ``#anchor`` when it
points into a page) and paths in backticks that name a file or folder of the repository
(``bench/results/<run>/``, ``examples/...``): a figure quoted in the docs must lead to its
results. Web links are not fetched.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Top-level folders whose paths, written in backticks, are references to the repository.
_ROOTS = ("bench/", "docs/", "examples/", "scripts/", "tests/", "opsmith/", ".ci/")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    out = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def _links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def _code_paths(page: Path) -> list[str]:
    found = []
    for text in _CODE.findall(_FENCE.sub("", page.read_text())):
        text = text.strip()
        if not text.startswith(_ROOTS) or re.search(r"[\s*<>${}|]|\.\.\.", text):
            continue  # a command, a pattern or a placeholder, not a path
        found.append(text.split("::")[0].split(":")[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_to_repository_files_resolve(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_paths_in_backticks_name_repository_files(page):
    missing = [p for p in _code_paths(page) if not (REPO / p).exists()]
    assert not missing, f"{page.relative_to(REPO)}: names paths the repository does not hold: {missing}"


def test_the_checker_sees_a_broken_link_and_a_missing_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Speed, measured\n[ok](#speed-measured) [bad](#nowhere) [gone](gone.md)\n"
                    "[web](https://example.com) `bench/results/no-such-run/`\n```\n[in code](x.md)\n```\n")
    assert _links(page) == ["#speed-measured", "#nowhere", "gone.md"]
    assert _anchors(page) == {"speed-measured"}
    assert _code_paths(page) == ["bench/results/no-such-run/"]
