# Where the encryption key comes from: --key-file, then SESSIONSTORED_KEY_FILE,
# then the systemd credential $CREDENTIALS_DIRECTORY/sessionstored.key. No key
# anywhere means a plaintext store. The shipped unit loads the credential from
# /etc/credstore/sessionstored.key with the fallback value "none" (systemd 252
# fails a start whose LoadCredential= file is missing unless SetCredential=
# gives a fallback), so a credential reading "none" also means no key.
from __future__ import annotations

import os
from collections.abc import Mapping

from .storage.sealing import KEY_BYTES, Key, KeyFileError, parse_key

CREDENTIAL_NAME = "sessionstored.key"
NO_KEY_CREDENTIAL = b"none"
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
    key = read_key_source(path, credential=False)
    assert key is not None
    return key


def read_key_source(path: str, *, credential: bool) -> Key | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"cannot read key file {path}: {error.strerror}") from None
    if credential and data.strip() == NO_KEY_CREDENTIAL:
        return None
    return parse_key(data, f"key file {path}")


def load_key(explicit: str | None, env: Mapping[str, str]) -> Key | None:
    """The configured key, or None for a plaintext store; KeyFileError in one line."""
    path = key_path(explicit, env)
    if path is None:
        return None
    from_credential = not explicit and not env.get("SESSIONSTORED_KEY_FILE")
    return read_key_source(path, credential=from_credential)
