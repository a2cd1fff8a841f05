# One document in a backup (the `backup` op writes it, `sessionstored restore`
# reads it): the CBOR array [kind, id, seq, digest, body], its body the
# canonical bytes as stored, a sixth item, expires_at_ms (0: never), for a
# generation that expires or says when it was committed, and a seventh,
# committed_at_ms, for a session's generation that says. A session may appear
# more than once: its earlier generations kept (--keep-generations), each with
# its own, lower, seq. In a sealed store it is sealed with the store's key
# (AES-256-GCM), bound to the backup's id and its position, so the file holds no
# plaintext, ids included, and a payload cannot be moved within or between
# backups.
from __future__ import annotations

import struct

import cbor2

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..storage.documents import Document
from ..storage.errors import SealError
from ..storage.mutations import LEASE
from ..storage.sealing import Sealer
from . import document_arguments

KIND_NAMES = {**document_arguments.KIND_NAMES, LEASE: "lease"}  # storage kind -> its wire name
KINDS = {name: kind for kind, name in KIND_NAMES.items()}
SEALED_AS = b"sessionstore/backup/1\0"  # then the backup id and the payload's position


class BadPayload(ValueError):
    pass


def binding(backup_id: bytes, position: int) -> bytes:
    return SEALED_AS + backup_id + struct.pack("<Q", position)


def encode(sealer: Sealer, backup_id: bytes, position: int, doc: Document) -> bytes:
    items: list[object] = [KIND_NAMES[doc.kind], doc.id, doc.seq, doc.digest, doc.body]
    if doc.committed_at_ms:
        items += [doc.expires_at_ms, doc.committed_at_ms]
    elif doc.expires_at_ms:
        items.append(doc.expires_at_ms)
    plain = cbor2.dumps(items)
    return sealer.seal(plain, binding(backup_id, position))


def decode(sealer: Sealer, backup_id: bytes, position: int, payload: bytes) -> Document:
    """The document, checked (it opens, it is well formed, its body matches its
    digest); BadPayload says what is wrong."""
    try:
        plain = sealer.open(payload, binding(backup_id, position))
    except SealError as error:
        raise BadPayload(error.reason) from None
    try:
        kind_name, doc_id, seq, digest, body, *rest = cbor2.loads(plain)
    except (ValueError, TypeError, cbor2.CBORDecodeError) as error:
        raise BadPayload(f"not a backup document: {error}") from None
    if kind_name not in KINDS or not isinstance(doc_id, str) or not isinstance(seq, int):
        raise BadPayload("not a backup document: bad kind, id or seq")
    expires_at_ms, committed_at_ms = [*rest, 0, 0][:2]
    if len(rest) > 2 or type(expires_at_ms) is not int or expires_at_ms < 0:
        raise BadPayload("not a backup document: bad expires_at_ms")
    if type(committed_at_ms) is not int or committed_at_ms < 0:
        raise BadPayload("not a backup document: bad committed_at_ms")
    if not isinstance(body, bytes) or digest_bytes_of_canonical(body) != digest:
        raise BadPayload(f"{kind_name} {doc_id!r}: the body does not match its digest")
    return Document(KINDS[kind_name], doc_id, seq, digest, body, expires_at_ms, committed_at_ms)
