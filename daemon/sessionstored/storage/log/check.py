# The consistency checker behind `verify`, also run at the end of storage tests:
# every indexed document, and every earlier generation of a session kept, is
# read back whole and must match the index (record checksum, id, seq, digest);
# every damaged record recovery found is listed; every segment file must be
# one the store knows; tmp/ may hold only the spare segment between batches.
from __future__ import annotations

from collections.abc import Sequence

from ..documents import SESSION
from ..engine import Problem
from ..errors import CorruptRecord
from .segments import SEGMENT_SUFFIX, segment_number
from .state import LogState
from .store_reads import read_entry


def check(state: LogState, retiring: Sequence[int]) -> tuple[int, list[Problem]]:
    """retiring: segments compaction replaced, not yet unlinked (checkpointing.py)."""
    problems: list[Problem] = []
    index, log = state.index, state.log
    rows = [(k, i, e, False) for k in index.kinds() for i, e in index.items(k)]
    checked = len(rows)  # documents; their earlier generations are read, not counted
    rows += [(SESSION, doc_id, entry, True) for doc_id, entry in index.earlier_rows()]
    for kind, doc_id, entry, earlier in rows:
        try:
            read_entry(state, kind, doc_id, entry)
        except (CorruptRecord, OSError) as error:
            file = getattr(error, "path", log.path(entry.segment))
            offset = getattr(error, "offset", entry.offset)
            seq = entry.seq if earlier else None  # an earlier generation names its seq
            problems.append(Problem("unreadable", str(error), file, offset, seq, id=doc_id))
    for id_hash, seq, path, offset, reason, damaged_id in state.damaged.values():
        if id_hash < 0:  # no id hash survived (damage.py)
            outcome = "which document it held is unknown, and that one may show an older state"
        else:
            outcome = "the generation it held is lost; the document is io_error"
        problems.append(Problem("damaged", f"{reason}: {outcome}", path, offset, seq, damaged_id))
    known = set(log.used) | set(retiring)
    for name in state.fs.listdir(log.directory):
        number = segment_number(name)
        if number is not None and number not in known:
            problems.append(Problem("orphan", file=f"{log.directory}/{name}"))
    for name in state.fs.listdir(log.tmp_dir):
        if not (name.startswith("spare-") and name.endswith(SEGMENT_SUFFIX)):
            problems.append(Problem("stray_temp", file=f"{log.tmp_dir}/{name}"))
    return checked, problems
