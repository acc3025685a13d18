"""The README is the front door and the manual is docs/ (issue 36): the README stays short, and
every relative link in it and in docs/*.md leads to a file that exists and, for a heading, to
a heading that exists there, so a section moved from one page to another leaves no link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 250

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1", re.DOTALL)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, the punctuation dropped (formatting
    included), each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", title.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in a page, a repeated one with GitHub's -1, -2 suffixes."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = anchor(match["title"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The page's links to files of this repository (not those shown inside code)."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return [m["target"] for m in LINK.finditer(text) if not m["target"].startswith(EXTERNAL)]


def test_the_readme_is_a_front_door_not_a_manual() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")

    assert lines <= README_LINES, (
        f"README.md is {lines} lines, over {README_LINES}: the reference belongs in docs/"
    )


def test_the_anchors_are_githubs() -> None:
    assert anchor("Looking at a deployed stack's runs: `ratchet serve`") == (
        "looking-at-a-deployed-stacks-runs-ratchet-serve"
    )
    assert anchor("What 1,000 steps cost") == "what-1000-steps-cost"
    assert anchor("The command's start-up (`python -m bench.cli_start`)") == (
        "the-commands-start-up-python--m-benchcli_start"
    )
    assert relative_links(README), "the README links nowhere: the parser lost its links"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken: list[str] = []
    for target in relative_links(page):
        path, _, heading = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no {file.relative_to(ROOT)}")
        elif heading and file.suffix == ".md" and heading not in anchors(file):
            broken.append(f"{target}: no heading #{heading} in {file.relative_to(ROOT)}")

    assert broken == [], f"{page.relative_to(ROOT)} links to what is not there: {broken}"
