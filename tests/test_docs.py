"""The front page and the docs index stay true: every command is in the README's table, every
docs page is reachable from the index, and every relative link points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

from cbbench.harness.cli import COMMAND_HELP

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+\.md)(#[^)]*)?\)")


def test_readme_is_a_front_page_listing_every_command():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    missing = [c for c in COMMAND_HELP if f"`cbbench {c}" not in text]
    assert not missing, f"commands missing from README's CLI table: {missing}"


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {m.group(1) for m in LINK.finditer(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages - linked == set(), f"docs pages not linked from docs/index.md: {pages - linked}"


def test_relative_markdown_links_resolve():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
