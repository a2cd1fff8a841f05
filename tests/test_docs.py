# The documentation's own rules: a README a user reads in five minutes, no issue
# numbers or development history in what users read, a configuration page that
# names every flag the daemon takes, and a site whose every page is in its nav.
from __future__ import annotations

import re
from pathlib import Path

from sessionstored.config import _parser

ROOT = Path(__file__).resolve().parent.parent
USER_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_no_issue_numbers_in_what_users_read() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in USER_PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bissues? [0-9]", line, re.IGNORECASE)
    ]
    assert found == []


def test_the_configuration_page_names_every_flag() -> None:
    page = (ROOT / "docs" / "operations" / "configuration.md").read_text()
    flags = [
        option
        for action in _parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--version")
    ]
    assert len(flags) > 20
    assert [flag for flag in flags if f"`{flag}`" not in page] == []


def test_every_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").glob("**/*.md")]
    assert [page for page in pages if f": {page}" not in nav] == []
