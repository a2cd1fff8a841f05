# The documentation's own rules: a README a user reads in five minutes, no issue
# numbers or development history in what users read, a configuration page that
# names every flag the daemon takes, and a site whose every page is in its nav.
from __future__ import annotations

import re
import struct
from pathlib import Path

from sessionstored.config import _parser
from sessionstored.storage.log import records, segments

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


def _layout(page: str, caption: str) -> list[tuple[int, str]]:
    """(offset, type) of each row of the `| offset | field | type |` table after caption."""
    table = page[page.index(caption) :].split("\n\n")[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    return [(int(offset), kind.strip()) for offset, _, kind in rows]


def _struct_format(layout: list[tuple[int, str]]) -> tuple[str, int]:
    codes = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
    out, at = "<", 0
    for offset, kind in layout:
        assert offset == at, (offset, at)
        size = int(kind.split()[0]) if kind.endswith("bytes") else None
        out += f"{size}s" if size else codes[kind]
        at += size or struct.calcsize("<" + codes[kind])
    return out, at


def test_the_on_disk_page_has_each_layout_as_the_code_writes_it() -> None:
    page = (ROOT / "docs" / "internals" / "on-disk.md").read_text()
    record, record_bytes = _struct_format(_layout(page, "Record header (52 bytes)"))
    assert record == records.HEADER.format + "Q" and record_bytes == records.HEADER_BYTES == 52
    segment, segment_bytes = _struct_format(_layout(page, "Segment header (32 bytes)"))
    zero_padded = segments.SEGMENT_HEADER.format.replace("7x", "7s") + "Q"
    assert segment == zero_padded and segment_bytes == segments.SEGMENT_HEADER_BYTES == 32
    assert records.COMMIT_PAYLOAD.format == "<QIQ"  # first seq, intents, committed_at_ms
    assert "first seq (u64), intents in the batch (u32), `committed_at_ms` (u64)" in page


def test_the_on_disk_page_names_every_field_of_an_index_checkpoint() -> None:
    import cbor2

    from sessionstored.storage.log.index import Index
    from sessionstored.storage.log.index_checkpoint import (
        CKPT_HEAD,
        IndexCheckpointState,
        encode_checkpoint,
    )
    from sessionstored.storage.sealing import PLAINTEXT

    state = IndexCheckpointState(
        generation=1, seq=0, batch=0, position=(0, 0), next_segment=1, segments={}, index=Index()
    )
    written = cbor2.loads(encode_checkpoint(state, PLAINTEXT)[CKPT_HEAD.size :])
    page = (ROOT / "docs" / "internals" / "on-disk.md").read_text()
    named = re.search(r"CBOR `\{([^}]*)\}`", page)
    assert named is not None
    assert [field.strip() for field in named[1].split(",")] == list(written)
