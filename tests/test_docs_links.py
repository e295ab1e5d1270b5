"""The README and docs/ link only to what exists: every relative link names a file of the repository, and
every ``#anchor`` a heading of the page it points to (GitHub's slugs); the README stays a short first read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

#: Independent of torch's release and of the trainers: run once, in CI's main lane (the pins lane deselects
#: it, .ci/lanes.sh)
pytestmark = pytest.mark.main_lane_only

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"(?ms)^```.*?^```")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.*)$", text)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:: not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_slug_is_githubs() -> None:
    assert slug("Speed: the trainer's own function and rebatch's drop-in, in one run") == (
        "speed-the-trainers-own-function-and-rebatchs-drop-in-in-one-run"
    )
    assert slug("The startup hook: `rebatch_startup`") == "the-startup-hook-rebatch_startup"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [bad](missing.md) [bad anchor](#nowhere)\n")
    assert links(page) == ["#title", "missing.md", "#nowhere"]
    assert "title" in anchors(page)
    assert "nowhere" not in anchors(page)


def test_the_readme_is_a_short_first_read() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines; the details belong in docs/"
