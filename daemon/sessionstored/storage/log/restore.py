# A log store built from a backup's documents (`sessionstored restore`) by
# compacted_build.py, as migrate_v1.py builds one: the documents go into compacted
# segments, and an index checkpoint at the backup's seq names them, so the store
# opens at that seq and a resuming watcher's seq never goes back. Each document
# keeps its own seq; a session's earlier generations (a session named more than
# once) are kept as earlier generations.
#
# The store is built beside the target, in DIR.restoring, and renamed to DIR
# only once it is whole and opens clean: a restore that crashes leaves no state
# directory under DIR's name that a daemon could take for an (empty) store.
from __future__ import annotations

from collections.abc import Iterable

from ..documents import Document
from ..errors import RestoreRefused
from ..sealing import Key, Sealer
from .compacted_build import write_compacted_store
from .fs import FileSystem
from .recovery import open_store


def restore_log(
    fs: FileSystem, target: str, key: Key | None, documents: Iterable[Document], seq: int
) -> int:
    """Build the store in target (absent, or an empty directory); returns how many
    documents it holds."""
    if fs.exists(target) and (not fs.is_dir(target) or fs.listdir(target)):
        raise RestoreRefused(f"{target}: not empty; restore builds a new store only")
    building = f"{target}.restoring"
    if fs.exists(building):
        raise RestoreRefused(f"{building}: left by an earlier restore; remove it first")
    fs.mkdir(building)
    store, _ = open_store(fs, building, key=key)  # the layout and FORMAT of a new store
    store.close()
    written = write_compacted_store(fs, building, Sealer(key), documents, seq)
    store, _ = open_store(fs, building, key=key)
    try:
        _, problems = store.verify()
        if problems or store.seq != seq:
            raise RestoreRefused(f"{building}: the restored store does not check: {problems}")
    finally:
        store.close()
    if fs.exists(target):
        fs.rmdir(target)
    fs.rename(building, target)
    fs.fsync_dir(target.rsplit("/", 1)[0] or "/")  # the new name survives power loss
    return written
