# The `backup` op: the engine's state at one seq, streamed on the connection that
# asked (like `watch`, the connection is the stream's until it ends):
#
#     {ok, backup: true, seq, documents, backup_id, sealed_with_key_id, source}
#     {payloads: [bytes, ...]}            ... about a MiB of documents each
#     {end: true, seq, documents}         (or an error reply, and nothing after)
#
# A payload is one document (backup_payload.py), sealed in a sealed store, so the
# client holds no plaintext. The snapshot is taken on the readers' thread (the
# log copies its index there) and read in threads a chunk at a time; the
# socket's own backpressure paces it, so a slow client slows only itself.
from __future__ import annotations

import secrets

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, error_response, ok_response

from ..storage.documents import Document
from ..storage.errors import CorruptRecord
from ..storage.sealing import Sealer
from . import backup_payload
from .context import OpContext
from .registry import Op
from .steps import Step, Stream
from .watch import Sink

BACKUP_ID_BYTES = 16
MESSAGE_BYTES = 1 << 20  # payload bytes per stream message, about


def _payloads(sealer: Sealer, backup_id: bytes, first: int, docs: list[Document]) -> list[bytes]:
    return [
        backup_payload.encode(sealer, backup_id, position, doc)
        for position, doc in enumerate(docs, start=first)
    ]


def backup(ops: OpContext, request: Request) -> Step:
    async def stream(sink: Sink) -> None:
        try:
            snapshot = await ops.query(ops.store.backup_snapshot)
        except (CorruptRecord, OSError) as error:
            await sink.send(error_response(request, ErrorCode.IO_ERROR, str(error)))
            return
        try:
            stats = await ops.query(ops.store.stats)
            backup_id = secrets.token_bytes(BACKUP_ID_BYTES)
            sealer = ops.store.sealer  # one key for the whole file, though a rotation moves on
            await sink.send(
                ok_response(
                    request,
                    backup=True,
                    seq=snapshot.seq,
                    documents=snapshot.documents,
                    backup_id=backup_id,
                    sealed_with_key_id=sealer.key_id_hex,
                    source=stats.get("backend", "log"),
                )
            )
            sent = pending_bytes = 0
            pending: list[bytes] = []
            chunks = snapshot.chunks()
            while (chunk := await trio.to_thread.run_sync(next, chunks, None)) is not None:
                payloads = await trio.to_thread.run_sync(
                    _payloads, sealer, backup_id, sent + len(pending), chunk
                )
                pending += payloads
                pending_bytes += sum(map(len, payloads))
                if pending_bytes >= MESSAGE_BYTES:
                    await sink.send({"payloads": pending})
                    sent, pending, pending_bytes = sent + len(pending), [], 0
            if pending:
                await sink.send({"payloads": pending})
                sent += len(pending)
            await sink.send({"end": True, "seq": snapshot.seq, "documents": sent})
        except (CorruptRecord, OSError) as error:
            await sink.send(error_response(request, ErrorCode.IO_ERROR, str(error)))
        finally:
            snapshot.close()

    return Stream(request, stream)


OPS = (Op("backup", backup, set(), read_only=True),)
