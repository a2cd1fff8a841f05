# Where the encryption key comes from: --key-file, then SESSIONSTORED_KEY_FILE,
# then the systemd credential $CREDENTIALS_DIRECTORY/sessionstored.key. No key
# anywhere means a plaintext store.
from __future__ import annotations

import os
from collections.abc import Mapping

from .storage.sealing import KEY_BYTES, Key, KeyFileError, parse_key

CREDENTIAL_NAME = "sessionstored.key"
MAX_KEY_FILE_BYTES = 4 * KEY_BYTES


def key_path(explicit: str | None, env: Mapping[str, str]) -> str | None:
    if explicit:
        return explicit
    if env.get("SESSIONSTORED_KEY_FILE"):
        return env["SESSIONSTORED_KEY_FILE"]
    credentials = env.get("CREDENTIALS_DIRECTORY")
    if credentials:
        candidate = os.path.join(credentials, CREDENTIAL_NAME)
        if os.path.exists(candidate):
            return candidate
    return None


def read_key_file(path: str) -> Key:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"cannot read key file {path}: {error.strerror}") from None
    return parse_key(data, f"key file {path}")
