# `make install`: the CLI's bash and zsh completion and its man pages, all generated
# from the CLI's own parser, written under a prefix (default ~/.local):
#   PREFIX/share/bash-completion/completions/sessionstore
#   PREFIX/share/zsh/site-functions/_sessionstore
#   PREFIX/share/man/man1/sessionstore.1, sessionstore-COMMAND.1
from __future__ import annotations

import os
import sys
from pathlib import Path

from .cli_parser import build_parser, manual_pages


def install(prefix: Path) -> list[Path]:
    import shtab

    parser = build_parser()
    written = {
        prefix / "share/bash-completion/completions/sessionstore": shtab.complete(parser, "bash"),
        prefix / "share/zsh/site-functions/_sessionstore": shtab.complete(parser, "zsh"),
    }
    for name, page in manual_pages().items():
        written[prefix / "share/man/man1" / f"{name}.1"] = page
    for path, text in written.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(written)


def main() -> int:
    prefix = Path(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.local"))
    for path in install(prefix):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
