# Key rotation (also sealing a plaintext store, or unsealing one), offline and
# crash-safe at every step:
#
#   1. REKEY is written (metadata.py): from now on the store opens with either
#      key, and every open finishes the rotation before anything is served.
#   2. A new append segment is started, then every live record is resealed
#      under the new key into one compacted segment (compaction.py: temp,
#      fsync, rename, fsync of log/).
#   3. An index checkpoint under the new key names only the new segments; the
#      old ones and the checkpoints sealed with the old key are removed.
#   4. FORMAT names the new key id; REKEY is removed.
# A crash anywhere before step 4 leaves REKEY in place, and the next open does
# it all again from the state on disk, which either key opens.
from __future__ import annotations

from dataclasses import dataclass

from ..sealing import Key, Sealer
from . import compaction
from .metadata import FORMAT_FILE, REKEY_FILE, RekeyBridge, format_text, write_durably
from .segments import SEGMENT_HEADER_BYTES
from .store import Store


@dataclass
class RekeyReport:
    bridge: str
    resealed: int = 0  # documents
    earlier: int = 0  # earlier generations of sessions

    def describe(self) -> str:
        earlier = f" and {self.earlier} earlier generations" if self.earlier else ""
        return f"{self.resealed} documents{earlier}"


def begin_rekey(
    store: Store, new: Key | None, progress: compaction.Progress | None = None
) -> RekeyReport:
    """Rotate an open store (no rotation pending) from its key to `new`."""
    old = store.sealer.seal_with
    bridge = RekeyBridge.between(old, new)
    write_durably(store.state.fs, store.state.root, REKEY_FILE, bridge.encode())
    store.set_sealer(Sealer.for_rotation(old, new))
    return finish_rekey(store, bridge, progress)


def finish_rekey(
    store: Store, bridge: RekeyBridge, progress: compaction.Progress | None = None
) -> RekeyReport:
    """Steps 2-4, from wherever an earlier attempt stopped. The store is open and idle."""
    report = RekeyReport(bridge.describe())
    fs, root, log, compactor = store.state.fs, store.state.root, store.state.log, store.compactor
    if log.offset != SEGMENT_HEADER_BYTES:
        log.rotate(0)  # nothing after this point is written under the old key
    work = compactor.choose(all_segments=True)
    if work is not None:
        compactor.copy(work, reseal=True, progress=progress)
        moved = compactor.switch(work)
        report.resealed, report.earlier = moved - work.earlier_moved, work.earlier_moved
    store.checkpointing.write()
    log.close_retired()
    new = store.sealer.seal_with
    write_durably(fs, root, FORMAT_FILE, format_text(new.key_id_hex if new else None))
    fs.unlink(f"{root}/{REKEY_FILE}")
    fs.fsync_dir(root)
    store.set_sealer(Sealer(new))
    return report
