# Every file path that a comment, a docstring, README.md or a page under docs/ names
# (`segments.py`, `storage/log/store.py`) is a file of this repository, so that a
# move or a rename cannot leave a pointer to nothing behind.
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.py)\b")
# files of other projects, named where we follow them
ELSEWHERE = {
    "tests/extensions/memory/test_advanced_sqlite_session.py": "the Agents SDK's own tests",
}


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return listed.stdout.split()


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a module's comments and docstrings, or of a page's lines."""
    text = path.read_text()
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    found = [
        (n, line[line.index("#") :]) for n, line in enumerate(text.splitlines(), 1) if "#" in line
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    return found


def named_but_missing(tracked: list[str], pages: list[Path]) -> list[str]:
    def exists(name: str) -> bool:
        return name in ELSEWHERE or any(f == name or f.endswith("/" + name) for f in tracked)

    return [
        f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{line}: {match[1]}"
        for page in pages
        for line, text in _prose(page)
        for match in NAMED.finditer(text)
        if not exists(match[1])
    ]


def test_every_file_named_in_prose_exists() -> None:
    tracked = _tracked()
    pages = [ROOT / f for f in tracked if f.endswith(".py")]
    pages += [
        ROOT / f
        for f in tracked
        if f == "README.md" or (f.startswith("docs/") and f.endswith(".md"))
    ]
    assert len(pages) > 200
    assert named_but_missing(tracked, pages) == []


def test_a_stale_name_is_found(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        '\N{NUMBER SIGN} the batch reaches the disk in log.py\n"""and in reserve.py"""\n'
    )
    found = named_but_missing(["daemon/sessionstored/storage/log/reserve.py"], [module])
    assert found == ["probe.py:1: log.py"]
