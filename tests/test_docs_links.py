"""Every relative link in README.md and docs/*.md points at a file or folder of the
repository (a renamed page or example breaks this), and no link leaves it by a relative path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), not inside `code`; the target ends at ')' or a space
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def relative_links(page: Path) -> list[str]:
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repo(page):
    broken = []
    for target in relative_links(page):
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
        elif not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_the_link_finder_finds_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("see [a](a.md#x), ![img](img/b.png), [web](https://x.org), [c](#here), "
                    "`[not](code.md)`\n```\n[nor](block.md)\n```\n")
    assert relative_links(page) == ["a.md#x", "img/b.png"]
