# mkdocs hooks (mkdocs.yml, `hooks:`). The site's Changes page is the repository's
# CHANGELOG.md, read at build time so that it is written once; its links, relative
# to the repository's root (docs/clients.md), are made relative to the site's pages.
from __future__ import annotations

from pathlib import Path
from typing import Any

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
PAGE = "changelog.md"  # docs/changelog.md: the page it fills


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_path != PAGE:
        return markdown
    return CHANGELOG.read_text().replace("](docs/", "](")
