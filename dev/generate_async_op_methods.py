# Writes client/sessionstore/async_op_methods.py from op_methods.py: the same class,
# its methods async and their calls into the transport awaited, formatted by ruff. `--check` exits 1
# when the file on disk is not what this writes (the tests run it so).
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parent.parent / "client" / "sessionstore"
SOURCE = CLIENT / "op_methods.py"
TARGET = CLIENT / "async_op_methods.py"
HEADER = (
    "# Generated from op_methods.py by dev/generate_async_op_methods.py: edit that file\n"
    "# and run `make generate`. The op methods of the trio and asyncio clients.\n"
)


def generate(source: str) -> str:
    body = source[source.index("from __future__") :]
    body = body.replace("class OpMethods:", "class AsyncOpMethods:")
    body = re.sub(r"^    def ", "    async def ", body, flags=re.M)
    body = re.sub(r"(return |= )self\._", r"\1await self._", body)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=HEADER + body,
        capture_output=True,
        text=True,
        check=True,
        cwd=CLIENT,
    )
    return formatted.stdout


def main() -> int:
    wanted = generate(SOURCE.read_text())
    if sys.argv[1:] == ["--check"]:
        if TARGET.read_text() != wanted:
            print(f"{TARGET} is stale: run `make generate`", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
