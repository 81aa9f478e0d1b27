"""Every relative link in README.md and docs/ points to a file inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) and ![alt](target), outside code spans; a target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _links(page: Path) -> list[str]:
    return LINK.findall(CODE.sub("", page.read_text()))


@pytest.mark.parametrize("page", [page for page in PAGES if page.exists()],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_in_the_repository(page: Path) -> None:
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_the_pages_link_to_each_other() -> None:
    readme = _links(ROOT / "README.md")
    for page in ("docs/architecture.md", "docs/settings.md", "docs/benchmarks.md", "docs/decisions/README.md"):
        assert page in readme, page
