# Keys built from several user-chosen parts (thread, namespace, session ids):
# each part percent-encoded, so it holds no "/" and the parts of a key never
# run into each other, or "!" + its SHA-256 when encoding makes it long ("!"
# never appears unencoded), so a key stays within the daemon's 1024 bytes.
from __future__ import annotations

import hashlib
from urllib.parse import quote

LONG_PART_CHARS = 200


def key_part(text: str) -> str:
    encoded = quote(text, safe="")
    if len(encoded) <= LONG_PART_CHARS:
        return encoded
    return "!" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
