# Where the encryption key comes from: --key-file, then SESSIONSTORED_KEY_FILE,
# then the systemd credential $CREDENTIALS_DIRECTORY/sessionstored.key. No key
# anywhere means a plaintext store. The shipped unit loads the credential from
# /etc/credstore/sessionstored.key with the fallback value "none" (systemd 252
# fails a start whose LoadCredential= file is missing unless SetCredential=
# gives a fallback), so a credential reading "none" also means no key.
#
# The previous key (a PostgreSQL store's online rekey) comes the same way:
# --previous-key-file, SESSIONSTORED_PREVIOUS_KEY_FILE, the credential
# sessionstored.previous-key.
from __future__ import annotations

import os
from collections.abc import Mapping

from ..storage.errors import KeyFileError
from ..storage.sealing import KEY_BYTES, Key, parse_key

CREDENTIAL_NAME = "sessionstored.key"
PREVIOUS_CREDENTIAL_NAME = "sessionstored.previous-key"
NO_KEY_CREDENTIAL = b"none"
MAX_KEY_FILE_BYTES = 4 * KEY_BYTES


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise KeyFileError(f"cannot read key file {path}: {error.strerror}") from None


def read_key_file(path: str) -> Key:
    return parse_key(_read(path), f"key file {path}")


def load_key(
    explicit: str | None,
    env: Mapping[str, str],
    *,
    variable: str = "SESSIONSTORED_KEY_FILE",
    credential_name: str = CREDENTIAL_NAME,
) -> Key | None:
    """The configured key, or None for a plaintext store; KeyFileError in one line."""
    path = explicit or env.get(variable)
    if path:
        return read_key_file(path)
    credentials = env.get("CREDENTIALS_DIRECTORY")
    credential = os.path.join(credentials, credential_name) if credentials else None
    if credential is None or not os.path.exists(credential):
        return None
    data = _read(credential)
    if data.strip() == NO_KEY_CREDENTIAL:  # only the credential may say "no key"
        return None
    return parse_key(data, f"key file {credential}")
