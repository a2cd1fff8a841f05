# The CPU that sealing adds to one document, in-process and without the disk:
# encoding a document file plain vs sealed (AES-256-GCM, the keyed name), and
# reading it back. The daemon rows of `make bench` show the same cost end to end.
from __future__ import annotations

import os
import time
from collections.abc import Callable

from sessionstore.canonical import digest_bytes_of_canonical
from sessionstored.storage.files import Document, DocumentFiles, encode_document
from sessionstored.storage.fs import RealFileSystem
from sessionstored.storage.sealing import Key, Sealer

from .workload import snapshot_bytes

ROUNDS = 20_000


def _per_call_us(action: Callable[[], object], rounds: int = ROUNDS) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        action()
    return (time.perf_counter() - started) / rounds * 1e6


def sealing_cost(size: int) -> dict[str, float]:
    body = snapshot_bytes("s0", size)
    doc = Document("s", "s0", 1, digest_bytes_of_canonical(body), body)
    plain = DocumentFiles(RealFileSystem(), "/nonexistent", 1 << 30, Sealer(None))
    sealed = DocumentFiles(
        RealFileSystem(), "/nonexistent", 1 << 30, Sealer(Key.from_material(os.urandom(32)))
    )
    plain_bytes, sealed_bytes = plain.seal(doc), sealed.seal(doc)
    plain_path, sealed_path = plain.path("s", "s0"), sealed.path("s", "s0")
    return {
        "encode_plain_us": _per_call_us(lambda: encode_document(doc)),
        "encode_sealed_us": _per_call_us(lambda: sealed.seal(doc)),
        "decode_plain_us": _per_call_us(lambda: plain.unseal(plain_path, plain_bytes)),
        "decode_sealed_us": _per_call_us(lambda: sealed.unseal(sealed_path, sealed_bytes)),
        "name_plain_us": _per_call_us(lambda: plain.name("s", "s0")),
        "name_sealed_us": _per_call_us(lambda: sealed.name("s", "s0")),
    }
