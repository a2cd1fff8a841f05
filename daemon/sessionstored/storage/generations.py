# A session's generations as `history`, `load at`, `revert` and `fork at` see
# them, on both engines: the current generation and the earlier ones the store
# keeps (--keep-generations N, at most N of them), newest first. The one
# "current at seq S" is the newest whose seq is at most S. Before the oldest
# one kept, the store cannot say what was current (the generations there were
# dropped, or the session did not exist yet): that is `compacted`, as etcd
# answers a read at a revision it compacted away.
from __future__ import annotations

from collections.abc import Sequence

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from .documents import Entry

DEFAULT_KEEP_GENERATIONS = 4
MAX_KEEP_GENERATIONS = 1024


def generation_at(generations: Sequence[Entry], at: int, doc_id: str) -> Entry | None:
    """The generation that was current at seq `at` (generations newest first); None when
    the session has none (it does not exist)."""
    for entry in generations:
        if entry.seq <= at:
            return entry
    if not generations:
        return None
    oldest = generations[-1].seq
    raise Refusal(
        ErrorCode.COMPACTED,
        f"session {doc_id!r} at seq {at}: no generation at or before that seq is kept (the "
        f"oldest kept is seq {oldest}): the session did not exist yet, or that generation "
        "is older than --keep-generations keeps",
        oldest_seq=oldest,
    )
