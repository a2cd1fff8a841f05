# The CPU that sealing adds to one document, in-process and without the disk:
# encoding a log record plain vs sealed (AES-256-GCM, the keyed id hash), and
# reading it back. The daemon rows of `make bench` show the same cost end to end.
from __future__ import annotations

import os
import time
from collections.abc import Callable

from sessionstore.wire.canonical import digest_bytes_of_canonical
from sessionstored.storage.documents import Document
from sessionstored.storage.log.records import encode_data, read_document
from sessionstored.storage.sealing import Key, Sealer

from .workload import snapshot_bytes

ROUNDS = 20_000


def per_call_us(action: Callable[[], object], rounds: int = ROUNDS) -> float:
    started = time.perf_counter()
    for _ in range(rounds):
        action()
    return (time.perf_counter() - started) / rounds * 1e6


def sealing_cost(size: int) -> dict[str, float]:
    body = snapshot_bytes("s0", size)
    doc = Document("s", "s0", 1, digest_bytes_of_canonical(body), body)
    plain, sealed = Sealer(None), Sealer(Key.from_material(os.urandom(32)))
    plain_bytes, sealed_bytes = encode_data(plain, 1, doc), encode_data(sealed, 1, doc)
    return {
        "encode_plain_us": per_call_us(lambda: encode_data(plain, 1, doc)),
        "encode_sealed_us": per_call_us(lambda: encode_data(sealed, 1, doc)),
        "decode_plain_us": per_call_us(
            lambda: read_document(plain, "log", 0, plain_bytes, "s", "s0")
        ),
        "decode_sealed_us": per_call_us(
            lambda: read_document(sealed, "log", 0, sealed_bytes, "s", "s0")
        ),
        "id_hash_plain_us": per_call_us(lambda: plain.id_hash("s", "s0")),
        "id_hash_sealed_us": per_call_us(lambda: sealed.id_hash("s", "s0")),
    }
