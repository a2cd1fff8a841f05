# Every exception the storage engine raises, in one place.
from __future__ import annotations

import errno


class FatalStorageError(Exception):
    """The store can no longer promise durability: stop, and let recovery run at the next start."""


class StoreLocked(Exception):
    pass


class StoreFormatError(Exception):
    """The state directory cannot be opened as it is; the message is one line naming why."""


class InjectedFault(OSError):
    def __init__(self, point: str) -> None:
        super().__init__(errno.EIO, f"injected fault at failpoint {point}")
        self.point = point


class NoSpace(OSError):
    """The disk is full: this operation is refused, the store goes on serving."""


class CorruptRecord(Exception):
    """Damaged bytes on disk, named by file and offset."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class RestoreRefused(Exception):
    """A restore's target is not an empty store, or what it built does not check."""
