# `sessionstore backup FILE`: the daemon's `backup` stream into a backup file
# (backup_file.py), written to a temp beside it, fsynced, then renamed: a file
# under FILE's name is a whole backup. An interrupted backup removes its temp.
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ..backup_file import BackupWriter
from ..client import Client

Progress = Callable[[int, int], None]  # (documents written, documents in the backup)


def take_backup(client: Client, path: str, progress: Progress | None = None) -> dict[str, Any]:
    started = time.monotonic()
    stream = client.backup()
    header = next(stream)
    fields = ("seq", "backup_id", "sealed_with_key_id", "source", "documents")
    writer = BackupWriter(path, {name: header[name] for name in fields})
    try:
        for message in stream:
            for payload in message.get("payloads", ()):
                writer.add(payload)
            if progress is not None:
                progress(writer.documents, header["documents"])
            if message.get("end"):
                if message["documents"] != writer.documents:
                    raise ValueError(
                        f"the daemon sent {writer.documents} documents, said {message['documents']}"
                    )
                break
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    seconds = time.monotonic() - started
    return {
        "path": path,
        "seq": header["seq"],
        "documents": writer.documents,
        "payload_bytes": writer.payload_bytes,
        "sealed_with_key_id": header["sealed_with_key_id"],
        "seconds": round(seconds, 3),
        "mb_per_s": round(writer.payload_bytes / seconds / 1e6, 1) if seconds else None,
    }


def tty_progress() -> Progress | None:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar = tqdm(desc="backing up", unit=" documents", file=sys.stderr)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update
