# The consistency checker behind `verify`, also run at the end of storage tests:
# every indexed document is read in full and must match the index (seq, digest,
# size, id); every file in docs/ must belong to an indexed document; tmp/ must
# be empty between batches.
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .files import CorruptDocument

if TYPE_CHECKING:
    from .store import Store


def check(store: Store) -> tuple[int, list[dict[str, Any]]]:
    problems: list[dict[str, Any]] = []
    checked = 0
    expected_names: set[str] = set()
    for kind in store.index.kinds():
        for doc_id, entry in store.index.items(kind):
            checked += 1
            path = store.files.path(kind, doc_id)
            expected_names.add(path.rsplit("/", 1)[1])
            try:
                doc = store.files.read(kind, doc_id)
            except (CorruptDocument, OSError) as error:
                problems.append(
                    {"kind": "unreadable", "id": doc_id, "file": path, "error": str(error)}
                )
                continue
            if doc is None:
                problems.append({"kind": "missing", "id": doc_id, "file": path})
            elif (doc.seq, doc.digest, len(doc.body)) != (entry.seq, entry.digest, entry.size):
                problems.append(
                    {
                        "kind": "mismatch",
                        "id": doc_id,
                        "file": path,
                        "error": f"file seq {doc.seq}, index seq {entry.seq}",
                    }
                )
    for name in store.files.list_names():
        if name not in expected_names:
            problems.append({"kind": "orphan", "file": f"{store.files.docs_dir}/{name}"})
    for name in store.fs.listdir(store.files.tmp_dir):
        problems.append({"kind": "stray_temp", "file": f"{store.files.tmp_dir}/{name}"})
    return checked, problems
