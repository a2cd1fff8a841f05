# Key rotation (also sealing a plaintext store, or unsealing one), offline and
# crash-safe at every step:
#
#   1. REKEY is written (metadata.py): from now on the store opens with either
#      key, and every open finishes the rotation before anything is served.
#   2. Every document is resealed under the new key and its new name: temp ->
#      fsync -> rename, a chunk at a time; fsync(docs/); then the old names are
#      unlinked and docs/ synced again. A document under both names holds the
#      same generation, so a crash anywhere here only repeats work.
#   3. A compaction writes an index checkpoint and the WAL under the new key;
#      the checkpoints sealed with the old key are removed.
#   4. FORMAT names the new key id; REKEY is removed.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .files import CorruptDocument
from .metadata import FORMAT_FILE, REKEY_FILE, RekeyBridge, format_text, write_durably
from .sealing import Key, Sealer

if TYPE_CHECKING:
    from .store import Store

RESEAL_CHUNK_DOCUMENTS = 1024


@dataclass
class RekeyReport:
    bridge: str
    resealed: int = 0
    unreadable: list[str] = field(default_factory=list)


def begin_rekey(store: Store, new: Key | None) -> RekeyReport:
    """Rotate an open store (no rotation pending) from its key to `new`."""
    old = store.sealer.seal_with
    bridge = RekeyBridge.between(old, new)
    write_durably(store.fs, store.root, REKEY_FILE, bridge.encode())
    store.set_sealer(Sealer.for_rotation(old, new))
    return finish_rekey(store, bridge)


def finish_rekey(store: Store, bridge: RekeyBridge) -> RekeyReport:
    """Steps 2-4, from wherever an earlier attempt stopped. The store is open and idle."""
    report = RekeyReport(bridge.describe())
    files, fs = store.files, store.fs
    renamed_from: list[str] = []
    for name in sorted(files.list_names()):
        path = f"{files.docs_dir}/{name}"
        data = fs.read_file(path, files.max_file_bytes)
        try:
            doc = files.unseal(path, data)
        except CorruptDocument as error:
            report.unreadable.append(str(error))
            continue
        if name not in files.names(doc.kind, doc.id):
            report.unreadable.append(f"{path}: file name does not match its id")
            continue
        target = files.name(doc.kind, doc.id)
        if name == target and store.sealer.is_sealed_with_current(data):
            continue
        files.install(files.write_temp(doc), doc.kind, doc.id)
        report.resealed += 1
        if name != target:
            renamed_from.append(name)
        if len(renamed_from) >= RESEAL_CHUNK_DOCUMENTS:
            _drop_old_names(store, renamed_from)
    _drop_old_names(store, renamed_from)

    store.compact()  # an index checkpoint and a WAL, both under the new key
    store.checkpoints.prune(1)
    fs.fsync_dir(store.checkpoints.directory)
    new = store.sealer.seal_with
    write_durably(fs, store.root, FORMAT_FILE, format_text(new.key_id_hex if new else None))
    fs.unlink(f"{store.root}/{REKEY_FILE}")
    fs.fsync_dir(store.root)
    store.set_sealer(Sealer(new))
    return report


def _drop_old_names(store: Store, names: list[str]) -> None:
    """The resealed files are durable under their new names before the old ones go."""
    store.files.sync()
    for name in names:
        store.fs.unlink(f"{store.files.docs_dir}/{name}")
    if names:
        store.files.sync()
    names.clear()
